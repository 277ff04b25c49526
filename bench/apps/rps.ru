# frozen_string_literal: true

# The Rack app of bench/middleware_rps.rb: each request builds and encodes a
# small page (about a millisecond of Ruby work), behind the middleware that
# BENCH_PROFILER names (none, strobe, stackprof), profiling every request
# in :wall mode at BENCH_INTERVAL microseconds, and saving what it took
# into BENCH_OUT as the server exits.
require "json"

module RpsApp
  module_function

  def page
    rows = Array.new(150) { |i| { id: i, name: "item #{i}", tags: %w[a b c].map { |t| "#{t}#{i % 7}" } } }
    JSON.generate(rows.select { |r| r[:id].even? }.map { |r| r.merge(score: r[:name].sum) })
  end
end

interval = Integer(ENV.fetch("BENCH_INTERVAL", "1000"))
case ENV.fetch("BENCH_PROFILER")
when "strobe"
  require "strobe/middleware"
  use Strobe::Middleware, enabled: true, mode: :wall, interval: interval, save_every: 1_000_000,
                          save_interval: false, path: "#{ENV.fetch('BENCH_OUT')}/strobe.json"
when "stackprof"
  require "stackprof"
  require "stackprof/middleware"
  use StackProf::Middleware, enabled: true, mode: :wall, interval: interval, save_every: 1_000_000, raw: false,
                             path: "#{ENV.fetch('BENCH_OUT')}/stackprof.dump"
  at_exit { StackProf::Middleware.save }
when "none" then nil
else raise "BENCH_PROFILER must be none, strobe or stackprof"
end
run ->(_env) { [200, { "content-type" => "application/json" }, [RpsApp.page]] }
