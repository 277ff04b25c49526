# frozen_string_literal: true

# Threads and CPU time, Strobe vs stackprof in the same run:
#
# 1. CPU-mode rate: one thread burns BENCH_CPU_SECONDS of its own CPU time
#    under :cpu at intervals 1000 and 250 µs; samples per CPU-second, and as
#    a share of the requested rate (budget for Strobe: at least 90 %).
# 2. Attribution: four threads, each in its own method, do work in known
#    proportions 40/30/20/10: burning CPU under :cpu, and sleeping under
#    :wall. Each profiler's share of samples per method (total_samples of
#    the four methods) against the known split; the error is the largest
#    difference in percentage points (budget for Strobe: under 2).
#
#   ruby -Ilib bench/threads.rb
#
# Settings: BENCH_CPU_SECONDS (2.0), BENCH_RATE_INTERVALS (1000,250),
# BENCH_SPLIT_SECONDS (1.0: the four threads' total), BENCH_REPS (3: runs per
# figure, the median reported).

require_relative "bench_helper"

module ThreadsBench
  CPU_SECONDS = Bench.env_float("BENCH_CPU_SECONDS", 2.0)
  RATE_INTERVALS = ENV.fetch("BENCH_RATE_INTERVALS", "1000,250").split(",").map { |i| Integer(i) }
  SPLIT_SECONDS = Bench.env_float("BENCH_SPLIT_SECONDS", 1.0)
  REPS = Bench.env_int("BENCH_REPS", 3)
  SPLIT = [40, 30, 20, 10].freeze
  RATE_BUDGET = 0.9
  ERROR_BUDGET = 2.0

  module_function

  def cpu_now
    Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  end

  # Burns this thread's CPU for seconds; returns the CPU time used.
  def spin(seconds)
    start = cpu_now
    x = 0
    x += 1 while cpu_now - start < seconds
    cpu_now - start
  end

  # One method per worker, so both profilers can tell them apart by frame.
  SPLIT.each_index do |i|
    module_eval <<~RUBY, __FILE__, __LINE__ + 1
      def self.worker_#{i}(kind, seconds) = kind == :cpu ? spin(seconds) : sleep(seconds)
    RUBY
  end

  def profile(target, mode, interval)
    case target
    when :strobe
      Strobe.run(mode: mode, interval: interval) { yield }
    when :stackprof
      StackProf.run(mode: mode, interval: interval) { yield }
    end
  end

  # ---- rate -----------------------------------------------------------------

  def rate(target, interval)
    cpu = nil
    result = profile(target, :cpu, interval) { cpu = spin(CPU_SECONDS) }
    result[:samples] / cpu
  end

  def rates
    Bench.header("CPU mode: samples per CPU-second, one thread burning #{CPU_SECONDS} s of CPU (median of #{REPS})")
    rows = RATE_INTERVALS.map do |interval|
      requested = 1_000_000.0 / interval
      ours, theirs = %i[strobe stackprof].map { |t| Bench.median(Array.new(REPS) { rate(t, interval) }) }
      $stderr.print "."
      [interval, requested, ours, theirs]
    end
    $stderr.puts
    Bench.table(
      ["interval µs", "requested/s", "Strobe/s", "Strobe % of requested", "stackprof/s", "stackprof % of requested", "ratio"],
      rows.map do |iv, req, ours, theirs|
        [iv, req.round, ours.round, pct(ours / req), theirs.round, pct(theirs / req), Bench.ratio(ours, theirs)]
      end
    )
    rows.each do |iv, req, ours, _|
      verdict = ours / req >= RATE_BUDGET ? "within" : "OVER"
      puts "interval #{iv} µs: Strobe at #{pct(ours / req)} of the requested rate, budget at least #{pct(RATE_BUDGET)}: #{verdict} budget"
    end
  end

  # ---- attribution -----------------------------------------------------------

  # {worker index => share of the four workers' samples, in percent}.
  def shares(result)
    counts = SPLIT.each_index.map do |i|
      frame = result[:frames].values.find { |f| f[:name] == "ThreadsBench.worker_#{i}" }
      frame ? frame[:total_samples] : 0
    end
    total = counts.sum
    counts.map { |c| total.zero? ? 0.0 : 100.0 * c / total }
  end

  def attribution_error(target, mode)
    seconds = SPLIT.map { |pct| SPLIT_SECONDS * pct / 100 }
    result = profile(target, mode, 1000) do
      seconds.each_with_index.map { |s, i| Thread.new { send(:"worker_#{i}", mode, s) } }.each(&:join)
    end
    got = shares(result)
    [SPLIT.zip(got).map { |want, have| (want - have).abs }.max, got]
  end

  def attribution
    puts
    Bench.header("Attribution: 4 threads split #{SPLIT.join('/')} (CPU under :cpu, sleep under :wall), median of #{REPS}")
    rows = %i[cpu wall].map do |mode|
      runs = %i[strobe stackprof].to_h do |t|
        measured = Array.new(REPS) { attribution_error(t, mode) }.sort_by(&:first)
        [t, measured[measured.size / 2]]
      end
      $stderr.print "."
      [mode, runs]
    end
    $stderr.puts
    Bench.table(
      ["mode", "Strobe shares %", "Strobe error (pp)", "stackprof shares %", "stackprof error (pp)"],
      rows.map do |mode, runs|
        s_err, s_got = runs[:strobe]
        p_err, p_got = runs[:stackprof]
        [mode, s_got.map { |v| v.round(1) }.join("/"), format("%.1f", s_err),
         p_got.map { |v| v.round(1) }.join("/"), format("%.1f", p_err)]
      end
    )
    rows.each do |mode, runs|
      err = runs[:strobe].first
      puts "#{mode}: Strobe's error #{format('%.1f', err)} pp, budget under #{ERROR_BUDGET}: #{err < ERROR_BUDGET ? 'within' : 'OVER'} budget"
    end
  end

  def pct(fraction)
    format("%.1f %%", fraction * 100)
  end

  def main
    rates
    attribution
  end
end

ThreadsBench.main if $PROGRAM_NAME == __FILE__
