# frozen_string_literal: true

# What continuous profiling costs a CPU-bound program: Strobe::Continuous
# at its defaults (:cpu at 100 Hz, a window uploaded every 15 s to a
# Pyroscope stand-in on 127.0.0.1, the governor holding 1 % of one CPU)
# against the same program unprofiled, and beside stackprof sampling :cpu
# at the same 100 Hz (no upload: stackprof has none) and, on a Ruby it
# supports, vernier (:wall, 10 ms: it has no CPU mode), all in the same run.
#
# Each variant is a child process doing the same fixed work (Bench::Workload,
# calibrated to BENCH_SECONDS of work); its cost is the process's CPU time,
# every thread's: the program's, the signal handler on it, Strobe's timer,
# window and upload threads. Rounds alternate the variants; the overhead is
# median(variant) / median(unprofiled) - 1. What Strobe measured of its own
# cost (the governor's figure, Continuous.stats[:overhead]) is printed too.
#
#   ruby -Ilib bench/continuous.rb
#
# Then, unless BENCH_GOVERN=0, one program under Strobe::Continuous at its
# defaults for BENCH_GOVERN seconds (240), printing each window's interval
# and Strobe's own measure of what it cost (handler, timer thread, its
# window and upload threads, by their CPU clocks): where the governor
# settles. This VM's noise (the same work's CPU time varies by several
# per cent between runs) is printed too: an A/B difference within it says
# nothing, the governor's figure is the precise one.
#
# Settings: BENCH_ROUNDS (3), BENCH_SECONDS (40: at least two windows),
# BENCH_GOVERN (240).

require_relative "bench_helper"
require "json"
require "socket"
require "rbconfig"

module ContinuousBench
  ROUNDS = Bench.env_int("BENCH_ROUNDS", 3)
  SECONDS = Bench.env_float("BENCH_SECONDS", 40)
  GOVERN = Bench.env_float("BENCH_GOVERN", 240)
  VERNIER = begin
    require "vernier"
    true
  rescue LoadError
    false
  end
  KINDS = [:none, :continuous, :stackprof, (:vernier if VERNIER)].compact.freeze
  LABELS = { none: "unprofiled", continuous: "Strobe::Continuous (defaults)", stackprof: "stackprof :cpu 100 Hz",
             vernier: "vernier :wall 10 ms" }.freeze

  module_function

  # A receiver that takes every upload (200), counting them.
  def receiver
    server = TCPServer.new("127.0.0.1", 0)
    count = Queue.new
    Thread.new do
      loop do
        socket = server.accept
        head = +""
        head << socket.readpartial(65_536) until head.include?("\r\n\r\n")
        head, body = head.split("\r\n\r\n", 2)
        length = head[/^content-length:\s*(\d+)/i, 1].to_i
        body << socket.readpartial(65_536) while body.bytesize < length
        socket.write("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        socket.close
        count << 1
      rescue IOError, SystemCallError
        socket&.close
      end
    end
    [server, count]
  end

  # In the child: the work, profiled by kind; prints its CPU time.
  def child(kind, units, url)
    workload = Bench::Workload.new
    workload.run(units / 50) # warm up
    case kind
    when "continuous"
      require "strobe/continuous"
      Strobe::Continuous.start(url: url, service_name: "bench") or abort "not started"
    when "stackprof" then StackProf.start(mode: :cpu, interval: 10_000, raw: true) or abort "stackprof did not start"
    when "vernier" then Vernier.start_profile(mode: :wall, interval: 10_000)
    end
    cpu0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    workload.run(units)
    extra = {}
    case kind
    when "continuous" then extra = Strobe::Continuous.stop
    when "stackprof" then StackProf.stop && extra[:samples] = StackProf.results[:samples]
    when "vernier" then Vernier.stop_profile
    end
    cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu0
    puts JSON.generate(extra.merge(cpu: cpu))
  end

  # In the child: continuous profiling at its defaults for `seconds` of
  # work; a line per window.
  def govern(seconds, url)
    require "strobe/continuous"
    workload = Bench::Workload.new
    Strobe::Continuous.start(url: url, service_name: "bench") or abort "not started"
    start = Bench.now
    seen = 0
    while Bench.now - start < seconds
      workload.run(200)
      stats = Strobe::Continuous.stats
      next unless stats[:windows] > seen

      seen = stats[:windows]
      puts JSON.generate(at: (Bench.now - start).round, interval: stats[:interval], overhead: stats[:overhead])
    end
    Strobe::Continuous.stop
  end

  def run
    Bench.header("Continuous profiling overhead (#{SECONDS} s of work, #{ROUNDS} rounds)")
    units = Bench::Workload.new.calibrate(SECONDS)
    server, uploads = receiver
    url = "http://127.0.0.1:#{server.addr[1]}"
    cpu = Hash.new { |h, k| h[k] = [] }
    seen = {}
    ROUNDS.times do |round|
      KINDS.rotate(round).each do |kind|
        out = IO.popen([RbConfig.ruby, "-I#{File.expand_path('../lib', __dir__)}", __FILE__, "--child", kind.to_s,
                        units.to_s, url], &:read)
        result = JSON.parse(out.lines.last, symbolize_names: true)
        cpu[kind] << result[:cpu]
        seen[kind] = result
        printf("  round %d %-32s %.2f s CPU\n", round + 1, LABELS.fetch(kind), result[:cpu])
      end
    end
    base = Bench.median(cpu[:none])
    rows = KINDS.map do |kind|
      m = Bench.median(cpu[kind])
      [LABELS.fetch(kind), format("%.2f", m), kind == :none ? "" : format("%+.2f %%", (m / base - 1) * 100)]
    end
    Bench.table(["variant", "CPU s (median)", "overhead"], rows)
    stats = seen[:continuous]
    puts
    puts "Strobe's own measure of its cost, last window: #{format('%.2f %%', stats[:overhead].to_f * 100)} of one CPU; " \
         "interval #{stats[:interval]} us; #{stats[:windows]} windows, #{stats[:uploaded]} uploaded " \
         "(#{uploads.size} received), #{stats[:bytes]} bytes"
    overhead = Bench.median(cpu[:continuous]) / base - 1
    theirs = Bench.median(cpu[:stackprof]) / base - 1
    puts "Strobe::Continuous / stackprof overhead: #{Bench.ratio(overhead, theirs)}"
    puts "vernier: not measured (needs its gem on Ruby 3.2.1+)" unless VERNIER
    low, high = cpu[:none].minmax
    puts format("Noise: the unprofiled runs took %.2f to %.2f s (%.1f %% apart)", low, high, (high / low - 1) * 100)
    govern_report(url) if GOVERN.positive?
  end

  def govern_report(url)
    Bench.header("The governor at its defaults (target 1 % of one CPU), #{GOVERN.round} s")
    lines = []
    IO.popen([RbConfig.ruby, "-I#{File.expand_path('../lib', __dir__)}", __FILE__, "--govern", GOVERN.to_s, url]) do |io|
      io.each_line do |line|
        window = JSON.parse(line, symbolize_names: true)
        lines << window
        printf("  at %4d s: interval %6d us, Strobe's cost in the window before %.2f %% of one CPU\n",
               window[:at], window[:interval], window[:overhead].to_f * 100)
      end
    end
    last = lines.last(3)
    return if last.empty?

    printf("Settled (last %d windows): interval %d us (%.0f Hz), cost %.2f %% of one CPU\n", last.size,
           last.last[:interval], 1e6 / last.last[:interval], last.sum { |w| w[:overhead].to_f } / last.size * 100)
  end
end

if ARGV.first == "--child"
  ContinuousBench.child(ARGV[1], Integer(ARGV[2]), ARGV[3])
elsif ARGV.first == "--govern"
  ContinuousBench.govern(Float(ARGV[1]), ARGV[2])
else
  ContinuousBench.run
end
