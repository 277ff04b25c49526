# frozen_string_literal: true

# Requests per second of a small Rack app under Puma (bench/apps/rps.ru,
# about a millisecond of Ruby work per request) with the middleware
# profiling every request in :wall mode at 1 kHz, against the same app
# unprofiled and under stackprof's middleware, measured in the same run:
# the servers take turns, round after round, and the median rate of each is
# printed with its ratio to the unprofiled one.
#
#   rake deps   # installs Puma (and rack, stackprof) for this Ruby
#   ruby -Ilib bench/middleware_rps.rb
#
# A Puma (single mode, BENCH_THREADS threads) on 127.0.0.1 per profiler;
# BENCH_CLIENTS client threads in this process send BENCH_REQUESTS
# keep-alive GETs per round. Settings: BENCH_ROUNDS (5), BENCH_REQUESTS
# (2000), BENCH_CLIENTS (4), BENCH_THREADS (4), BENCH_INTERVAL (1000 µs),
# BENCH_WARMUP (300 requests per server first).

require_relative "bench_helper"
require "rbconfig"
require "net/http"
require "tmpdir"

module RpsBench
  ROUNDS = Bench.env_int("BENCH_ROUNDS", 5)
  REQUESTS = Bench.env_int("BENCH_REQUESTS", 2000)
  CLIENTS = Bench.env_int("BENCH_CLIENTS", 4)
  THREADS = Bench.env_int("BENCH_THREADS", 4)
  INTERVAL = Bench.env_int("BENCH_INTERVAL", 1000)
  WARMUP = Bench.env_int("BENCH_WARMUP", 300)
  ROOT = File.expand_path("..", __dir__)
  APP = File.join(__dir__, "apps/rps.ru")
  PROFILERS = %w[none strobe stackprof].freeze

  module_function

  # A Puma serving the app under profiler: [pid, port].
  def start_server(profiler, dir)
    log = File.join(dir, "#{profiler}.log")
    gem_path = [File.join(ROOT, "tmp/app-gems", RUBY_VERSION), *Gem.path].join(File::PATH_SEPARATOR)
    env = { "BENCH_PROFILER" => profiler, "BENCH_INTERVAL" => INTERVAL.to_s, "GEM_PATH" => gem_path, "BENCH_OUT" => dir }
    pid = Process.spawn(env, RbConfig.ruby, "-I#{File.join(ROOT, 'lib')}", "-rpuma/cli", "-e", "Puma::CLI.new(ARGV).run",
                        "--", "-b", "tcp://127.0.0.1:0", "-t", "#{THREADS}:#{THREADS}", "-e", "production", APP,
                        out: log, err: %i[child out], chdir: dir)
    deadline = Bench.now + 60
    loop do
      port = File.read(log)[%r{Listening on http://127\.0\.0\.1:(\d+)}, 1]
      return [pid, Integer(port)] if port
      raise "Puma (#{profiler}) did not start: #{File.read(log)}" if Bench.now > deadline || Process.waitpid(pid, Process::WNOHANG)

      sleep 0.1
    end
  end

  # Requests per second for n GETs from CLIENTS keep-alive clients.
  def rate(port, n)
    queue = Queue.new
    n.times { queue << 1 }
    queue.close
    seconds = Bench.time do
      Array.new(CLIENTS) do
        Thread.new do
          Net::HTTP.start("127.0.0.1", port, open_timeout: 5, read_timeout: 30) do |http|
            while queue.pop
              response = http.get("/")
              raise "HTTP #{response.code}" unless response.code == "200"
            end
          end
        end
      end.each(&:join)
    end
    n / seconds
  end

  def run
    Dir.mktmpdir do |dir|
      servers = PROFILERS.to_h { |p| [p, start_server(p, dir)] }
      servers.each_value { |_, port| rate(port, WARMUP) }
      rates = PROFILERS.to_h { |p| [p, []] }
      ROUNDS.times do
        PROFILERS.each { |p| rates[p] << rate(servers[p][1], REQUESTS) }
        $stderr.print "."
      end
      $stderr.puts
      servers.each_value do |pid, _|
        Process.kill(:TERM, pid)
        Process.wait(pid)
      end
      report(rates.transform_values { |r| Bench.median(r) }, samples(dir, WARMUP + (ROUNDS * REQUESTS)))
    end
  end

  # Samples per request each profiler took over the whole run (its files,
  # saved as its server exited): Strobe samples every thread serving a
  # request at each tick, stackprof's process timer the one thread running.
  def samples(dir, requests)
    strobe = Strobe.load(File.join(dir, "strobe.json"))
    stackprof = Marshal.load(File.binread(File.join(dir, "stackprof.dump"))) # rubocop:disable Security/MarshalLoad
    { "strobe" => strobe[:samples].fdiv(requests), "stackprof" => stackprof[:samples].fdiv(requests) }
  end

  def report(rates, samples)
    Bench.header("Requests per second under Puma (#{THREADS} threads, #{CLIENTS} clients, :wall at #{INTERVAL} µs, " \
                 "median of #{ROUNDS} rounds of #{REQUESTS}; Ruby #{RUBY_VERSION})")
    rows = PROFILERS.map do |p|
      [p == "none" ? "unprofiled" : p, format("%.0f", rates[p]), Bench.ratio(rates[p], rates["none"]),
       samples[p] ? format("%.2f", samples[p]) : "-"]
    end
    Bench.table(["middleware", "requests/s", "vs unprofiled", "samples/request"], rows)
    puts
    puts "Strobe / stackprof requests per second: #{Bench.ratio(rates['strobe'], rates['stackprof'])}"
  end
end

RpsBench.run if $PROGRAM_NAME == __FILE__
