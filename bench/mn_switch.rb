# frozen_string_literal: true

# What profiling adds to a switch between M:N threads (Ruby 3.3+,
# RUBY_MN_THREADS=1; this script starts itself again with it): two threads
# hand a value back and forth through queues, 30 frames deep, unprofiled
# and then under :wall and :cpu at 1 kHz, each in a child of its own. Under
# M:N Strobe reads a thread's stack (:wall) or its CPU clock (:cpu) as it
# releases and takes the GVL, so this is the worst case: nothing but
# switches. `ruby -Ilib bench/mn_switch.rb`; BENCH_N (30000), BENCH_REPS (3).

require_relative "bench_helper"
require "rbconfig"

module MNSwitch
  N = Bench.env_int("BENCH_N", 30_000)
  REPS = Bench.env_int("BENCH_REPS", 3)

  module_function

  def ping_pong(n)
    q1 = Queue.new
    q2 = Queue.new
    a = Thread.new { Bench.descend(30) { n.times { q1 << 1; q2.pop } } }
    b = Thread.new { Bench.descend(30) { n.times { q1.pop; q2 << 1 } } }
    [a, b].each(&:join)
  end

  # Child: seconds for N round trips, unprofiled or under mode.
  def child(mode)
    ping_pong(1000)
    Strobe.start(mode: mode.to_sym, interval: 1000) unless mode == "none"
    seconds = Bench.time { ping_pong(N) }
    Strobe.stop unless mode == "none"
    puts seconds
  end

  def run(mode, mn)
    env = { "RUBY_MN_THREADS" => mn ? "1" : nil }
    times = Array.new(REPS) do
      IO.popen(env, [RbConfig.ruby, "-I#{File.expand_path('../lib', __dir__)}", __FILE__, "--child", mode], &:read).to_f
    end
    Bench.median(times)
  end

  def main
    abort "M:N threads need Ruby 3.3+" if RUBY_VERSION < "3.3"
    Bench.header("#{N} queue round trips between two threads, 30 frames deep (median of #{REPS})")
    rows = [true, false].map do |mn|
      base = run("none", mn)
      [mn ? "M:N" : "1:1", base, *%w[wall cpu].map { |mode| run(mode, mn) / base }]
    end
    Bench.table(["threads", "unprofiled s", ":wall slowdown", ":cpu slowdown"],
                rows.map { |name, base, wall, cpu| [name, format("%.3f", base), format("%.2fx", wall), format("%.2fx", cpu)] })
  end
end

if $PROGRAM_NAME == __FILE__
  ARGV.first == "--child" ? MNSwitch.child(ARGV[1]) : MNSwitch.main
end
