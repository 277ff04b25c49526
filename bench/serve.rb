# frozen_string_literal: true

# What `strobe serve` costs the program it profiles while a client reads
# the profile. A CPU-bound program (Bench::Workload, about 30 frames deep)
# runs under `strobe serve` at a high sampling rate, so its profile grows
# large; its iterations per second are measured in alternating windows,
# with no client, then with a client GETting the profile (gzipped, as the
# Firefox Profiler does) in a loop, and so on. Printed: the median rate of
# each kind of window and their ratio, the GETs per second and the size of
# a profile. The profile grows during the run, so the windows alternate
# rather than come one kind after the other.
#
#   ruby -Ilib bench/serve.rb
#
# Settings: BENCH_ROUNDS (4 windows of each kind), BENCH_WINDOW (3 s),
# BENCH_WARMUP (3 s before the first window), BENCH_INTERVAL (100 µs),
# BENCH_DEPTH (30), BENCH_UNITS (8 workload units per iteration).

require_relative "bench_helper"
require "rbconfig"
require "open3"
require "net/http"

module ServeBench
  ROUNDS = Bench.env_int("BENCH_ROUNDS", 4)
  WINDOW = Bench.env_float("BENCH_WINDOW", 3)
  WARMUP = Bench.env_float("BENCH_WARMUP", 3)
  INTERVAL = Bench.env_int("BENCH_INTERVAL", 100)
  DEPTH = Bench.env_int("BENCH_DEPTH", 30)
  UNITS = Bench.env_int("BENCH_UNITS", 8)
  REPORT_EVERY = 0.05
  ROOT = File.expand_path("..", __dir__)
  URL = %r{at (http://127\.0\.0\.1:\d+/\S+/profile\.json)}

  module_function

  # The profiled program: iterations of the workload, and on stdout, every
  # REPORT_EVERY seconds, "<its clock> <iterations so far>".
  def child
    workload = Bench::Workload.new(depth: DEPTH)
    count = 0
    report = Bench.now
    loop do
      workload.run(UNITS)
      count += 1
      next if (now = Bench.now) < report

      puts "#{now} #{count}"
      report = now + REPORT_EVERY
    end
  end

  # The program under `strobe serve`, and what it reports, as it comes.
  class Program
    attr_reader :url

    def initialize
      command = [RbConfig.ruby, "-I#{ROOT}/lib", "#{ROOT}/exe/strobe", "serve", "--port", "0",
                 "--interval", INTERVAL.to_s, "--", RbConfig.ruby, __FILE__, "--child"]
      stdin, @stdout, @stderr, @wait = Open3.popen3(*command)
      stdin.close
      @latest = nil
      @lock = Mutex.new
      @err = +""
      Thread.new { @stderr.each_line { |line| @err << line } }
      Thread.new do
        @stdout.each_line do |line|
          time, count = line.split
          @lock.synchronize { @latest = [Float(time), Integer(count)] }
        end
      end
      deadline = Bench.now + 60
      sleep 0.05 until (@url = @err[URL, 1]) || Bench.now > deadline
      raise "strobe serve did not start:\n#{@err}" unless @url
    end

    # [the program's clock, iterations so far] as last reported.
    def latest
      sleep 0.01 until (value = @lock.synchronize { @latest })
      value
    end

    # Iterations per second over the next `seconds`.
    def rate(seconds)
      start_time, start_count = latest
      sleep seconds
      end_time, end_count = latest
      (end_count - start_count) / (end_time - start_time)
    end

    def stop
      Process.kill(:TERM, @wait.pid) # one TERM ends the program and the server
      @wait.value
    end
  end

  # GETs the profile in a loop until stopped: [GETs, bytes of the last].
  class Client
    def initialize(url)
      @uri = URI(url)
      @stop = false
      @gets = 0
      @bytes = 0
      @thread = Thread.new { run }
    end

    def stop
      @stop = true
      @thread.join
      [@gets, @bytes]
    end

    private

    def run
      until @stop
        response = Net::HTTP.start(@uri.host, @uri.port, read_timeout: 60) do |http|
          http.request(Net::HTTP::Get.new(@uri, "Accept-Encoding" => "gzip"))
        end
        raise "GET #{@uri}: #{response.code}" unless response.code == "200"

        @gets += 1
        @bytes = response.body.bytesize
      end
    end
  end

  def main
    Bench.header("strobe serve: the program's iterations/s with and without a client " \
                 "(:wall, interval #{INTERVAL} µs)")
    program = Program.new
    sleep WARMUP
    idle = []
    served = []
    gets = 0
    bytes = 0
    ROUNDS.times do
      idle << program.rate(WINDOW)
      client = Client.new(program.url)
      served << program.rate(WINDOW)
      count, bytes = client.stop
      gets += count
      $stderr.print "."
    end
    $stderr.puts
    status = program.stop
    rows = [["no client", format("%.0f", Bench.median(idle)), idle.map { |r| format("%.0f", r) }.join(" ")],
            ["a client GETting in a loop", format("%.0f", Bench.median(served)),
             served.map { |r| format("%.0f", r) }.join(" ")]]
    Bench.table(["", "iterations/s (median)", "each window"], rows)
    puts
    puts "ratio (with client / without): #{Bench.ratio(Bench.median(served), Bench.median(idle))}"
    puts format("GETs: %.1f/s; the last profile: %.1f MB gzipped", gets / (ROUNDS * WINDOW), bytes / 1e6)
    puts "the program ended with #{status.inspect} after one TERM"
  end
end

if ARGV.first == "--child"
  ServeBench.child
else
  ServeBench.main
end
