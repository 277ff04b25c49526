# frozen_string_literal: true

# Slowdown of a CPU-bound Ruby program (Bench::Workload: method calls, hash,
# string and array work, about 30 frames deep) under wall-mode sampling at
# 1 kHz and 10 kHz, Strobe vs stackprof. One process alternates segments of
# fixed work, unprofiled and profiled: unprofiled, Strobe, unprofiled,
# stackprof, ...; slowdown = median(profiled time) / median(the unprofiled
# segments right before and after them) - 1.
#
# Also measured the same way, unless BENCH_FLOOR=0: two null profilers
# (bench/timer_floor.c, compiled on the fly and loaded with Fiddle) that only
# deliver timer signals to an empty handler, the way Strobe does (timer
# thread + tgkill) and the way stackprof does (setitimer). Their slowdown is
# what this machine charges for the signals alone.
#
#   ruby -Ilib bench/overhead.rb
#
# Settings: BENCH_ROUNDS (15), BENCH_SEGMENT (0.3 seconds of work per
# segment), BENCH_INTERVALS (1000,100 microseconds), BENCH_DEPTH (30),
# BENCH_RAW (0: raw off, as both profilers default), BENCH_FLOOR (1),
# BENCH_CLOCK (cpu: the workload thread's CPU time; wall: wall-clock time).

require_relative "bench_helper"
require "rbconfig"
require "tmpdir"
require "open3"

module Overhead
  ROUNDS = Bench.env_int("BENCH_ROUNDS", 15)
  SEGMENT = Bench.env_float("BENCH_SEGMENT", 0.3)
  INTERVALS = ENV.fetch("BENCH_INTERVALS", "1000,100").split(",").map { |i| Integer(i) }
  DEPTH = Bench.env_int("BENCH_DEPTH", 30)
  RAW = Bench.env_bool("BENCH_RAW", false)
  FLOOR = Bench.env_bool("BENCH_FLOOR", true)
  # What a segment's time is: the workload thread's own CPU time (default;
  # immune to the VM descheduling it, and the handler and postponed job both
  # run on that thread) or wall-clock time.
  CLOCK = { "cpu" => Process::CLOCK_THREAD_CPUTIME_ID, "wall" => Process::CLOCK_MONOTONIC }
          .fetch(ENV.fetch("BENCH_CLOCK", "cpu")) { abort "BENCH_CLOCK must be cpu or wall" }
  # Budgets for Strobe's slowdown, by interval in microseconds.
  BUDGETS = { 1000 => 0.005, 100 => 0.03 }.freeze

  LABELS = {
    strobe: "Strobe",
    stackprof: "stackprof",
    floor_thread: "empty handler, timer thread + tgkill (Strobe's way)",
    floor_itimer: "empty handler, setitimer (stackprof's way)"
  }.freeze

  # other_cpu: CPU time of the process's other threads during the segment
  # (Strobe's timer thread, which also records the samples).
  Segment = Struct.new(:kind, :time, :samples, :missed, :other_cpu, keyword_init: true)

  # The null profilers: timer_floor.c as a shared library, through Fiddle.
  class Floor
    WAYS = { floor_itimer: 0, floor_thread: 1 }.freeze

    # A Floor, or nil when the library cannot be built.
    def self.load(dir)
      require "fiddle"
      so = File.join(dir, "timer_floor.so")
      cc = RbConfig::CONFIG["CC"].to_s.split.first || "cc"
      _, status = Open3.capture2e(cc, "-O2", "-shared", "-fPIC", "-pthread",
                                  File.join(__dir__, "timer_floor.c"), "-o", so)
      status.success? ? new(so) : nil
    rescue LoadError, SystemCallError
      nil
    end

    def initialize(path)
      lib = Fiddle.dlopen(path)
      @start = Fiddle::Function.new(lib["floor_start"], [Fiddle::TYPE_INT, Fiddle::TYPE_INT], Fiddle::TYPE_INT)
      @stop = Fiddle::Function.new(lib["floor_stop"], [], Fiddle::TYPE_LONG)
    end

    def start(kind, interval)
      @start.call(WAYS.fetch(kind), interval).zero? or raise "timer_floor did not start"
    end

    # Signals handled since start.
    def stop
      @stop.call
    end
  end

  module_function

  def segment(workload, units, kind, interval, floor)
    GC.start
    case kind
    when :strobe then Strobe.start(mode: :wall, interval: interval, raw: RAW) or raise "Strobe did not start"
    when :stackprof then StackProf.start(mode: :wall, interval: interval, raw: RAW) or raise "stackprof did not start"
    when :floor_thread, :floor_itimer then floor.start(kind, interval)
    end
    t0 = Process.clock_gettime(CLOCK)
    own0 = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    all0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    workload.run(units)
    time = Process.clock_gettime(CLOCK) - t0
    own = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - own0
    other_cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - all0 - own
    samples, missed =
      case kind
      when :strobe then Strobe.stop && Strobe.results.values_at(:samples, :missed_samples)
      when :stackprof then StackProf.stop && StackProf.results.values_at(:samples, :missed_samples)
      when :floor_thread, :floor_itimer then [floor.stop, 0]
      else [0, 0]
      end
    Segment.new(kind: kind, time: time, samples: samples, missed: missed.to_i, other_cpu: other_cpu)
  end

  # After one discarded warm-up round, ROUNDS rounds of: unprofiled, then
  # one kind, unprofiled, the next kind, and so on (each round starting one
  # kind later, so none always follows the same one). Returns
  # {kind => [profiled segments, adjacent unprofiled segments]}.
  def measure(workload, units, interval, kinds, floor)
    timeline = []
    (ROUNDS + 1).times do |round|
      segments = kinds.rotate(round).flat_map do |kind|
        [segment(workload, units, nil, interval, floor), segment(workload, units, kind, interval, floor)]
      end
      timeline.concat(segments) unless round.zero?
      $stderr.print "."
    end
    $stderr.puts
    kinds.to_h do |kind|
      profiled = []
      adjacent = []
      timeline.each_with_index do |s, i|
        next unless s.kind == kind

        profiled << s
        adjacent.concat([timeline[i - 1], timeline[i + 1]].compact.reject(&:kind))
      end
      [kind, [profiled, adjacent]]
    end
  end

  def summary(profiled, adjacent)
    { slowdown: Bench.median(profiled.map(&:time)) / Bench.median(adjacent.map(&:time)) - 1,
      rate: profiled.sum(&:samples) / profiled.sum(&:time),
      other_cpu: profiled.sum(&:other_cpu) / profiled.sum(&:time),
      missed: profiled.sum(&:missed) }
  end

  # Half the interquartile range of segment times, relative to their median:
  # slowdowns below it are within noise.
  def noise(segments)
    times = segments.map(&:time).sort
    (times[(times.size * 3) / 4] - times[times.size / 4]) / 2 / Bench.median(times)
  end

  def pct(fraction)
    format("%+.2f %%", fraction * 100)
  end

  def report(interval, results, spread)
    hz = 1_000_000 / interval
    puts
    puts "interval #{interval} µs (#{hz} Hz)"
    Bench.table(
      ["run", "slowdown", "samples/s", "missed", "other threads' CPU"],
      results.map do |kind, r|
        [LABELS[kind], pct(r[:slowdown]), r[:rate].round, kind.start_with?("floor") ? "" : r[:missed],
         format("%.2f %%", r[:other_cpu] * 100)]
      end
    )
    ours = results[:strobe][:slowdown]
    theirs = results[:stackprof][:slowdown]
    puts "Strobe / stackprof slowdown: #{Bench.ratio(ours, theirs)}; noise of unprofiled segments: ±#{format('%.2f %%', spread * 100)}"
    if results[:floor_thread]
      puts "above the bare-signal floor of their own way: Strobe #{pct(ours - results[:floor_thread][:slowdown])}, " \
           "stackprof #{pct(theirs - results[:floor_itimer][:slowdown])}"
    end
    budget = BUDGETS[interval] or return
    puts "budget for Strobe: under #{pct(budget).delete('+')}: #{ours < budget ? 'within' : 'OVER'} budget"
  end

  def main
    Dir.mktmpdir("strobe-floor") do |dir|
      floor = FLOOR ? Floor.load(dir) : nil
      warn "(null profilers skipped: could not build bench/timer_floor.c)" if FLOOR && !floor
      kinds = %i[strobe stackprof]
      kinds += %i[floor_thread floor_itimer] if floor

      workload = Bench::Workload.new(depth: DEPTH)
      units = workload.calibrate(SEGMENT)
      Bench.header("Wall-mode overhead on a CPU-bound program (raw: #{RAW}): " \
                   "#{ROUNDS} rounds, #{units} work units (~#{SEGMENT} s) per segment")
      INTERVALS.each do |interval|
        measured = measure(workload, units, interval, kinds, floor)
        results = measured.transform_values { |profiled, adjacent| summary(profiled, adjacent) }
        report(interval, results, noise(measured.values.flat_map(&:last).uniq))
      end
    end
    puts
    puts "slowdown = median(profiled segment time) / median(adjacent unprofiled segment time) - 1."
    puts "samples/s = samples recorded (signals handled, for the empty handlers) / profiled time;"
    puts "the target is 1,000,000 / interval."
  end
end

Overhead.main if $PROGRAM_NAME == __FILE__
