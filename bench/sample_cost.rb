# frozen_string_literal: true

# Cost of ONE sample (capture + record), Strobe vs stackprof, in custom mode:
# at a stack of depth D, call Strobe.sample / StackProf.sample N times in a
# loop and subtract the same loop calling an empty method. Two stacks: the
# SAME stack every time (Strobe dedupes identical consecutive stacks
# cheaply) and a VARYING one (two leaf methods alternate).
#
#   ruby -Ilib bench/sample_cost.rb               # wall-clock ns/sample
#   ruby -Ilib bench/sample_cost.rb --callgrind   # instructions/sample, under valgrind
#
# Settings: BENCH_DEPTHS (10,30,100), BENCH_N (200000), BENCH_REPS (5),
# BENCH_RAW (1: both profilers keep raw samples), BENCH_CALLGRIND_N (20000),
# BENCH_JOBS (2: valgrind processes at a time).

require_relative "bench_helper"
require "rbconfig"
require "tmpdir"

module SampleCost
  DEPTHS = ENV.fetch("BENCH_DEPTHS", "10,30,100").split(",").map { |d| Integer(d) }
  N = Bench.env_int("BENCH_N", 200_000)
  REPS = Bench.env_int("BENCH_REPS", 5)
  RAW = Bench.env_bool("BENCH_RAW", true)
  CALLGRIND_N = Bench.env_int("BENCH_CALLGRIND_N", 20_000)
  JOBS = Bench.env_int("BENCH_JOBS", 2)
  VARIANTS = %i[same varying].freeze
  BUDGET = 1.0 / 3

  # The call each loop makes. The baseline is an empty C method (Kernel#itself)
  # called the same way, so only the profiler's own work is left after the
  # subtraction.
  CALLS = {
    empty: "Kernel.itself",
    strobe: "Strobe.sample",
    stackprof: "StackProf.sample"
  }.freeze

  # For each call: two leaf methods, a loop always through leaf_a (same
  # stack) and a loop alternating leaf_a and leaf_b (varying stack).
  CALLS.each do |name, call|
    module_eval <<~RUBY, __FILE__, __LINE__ + 1
      def self.#{name}_leaf_a = #{call}
      def self.#{name}_leaf_b = #{call}

      def self.#{name}_same(n)
        i = 0
        while i < n
          #{name}_leaf_a
          i += 1
        end
      end

      def self.#{name}_varying(n)
        i = 0
        while i < n
          if (i & 1).zero? then #{name}_leaf_a else #{name}_leaf_b end
          i += 1
        end
      end
    RUBY
  end

  module_function

  def start(target, raw)
    case target
    when :strobe then Strobe.start(mode: :custom, raw: raw) or raise "Strobe did not start"
    when :stackprof then StackProf.start(mode: :custom, raw: raw) or raise "stackprof did not start"
    end
  end

  def stop(target)
    case target
    when :strobe then Strobe.stop
    when :stackprof then StackProf.stop
    end
  end

  def results(target)
    case target
    when :strobe then Strobe.results
    when :stackprof then StackProf.results
    end
  end

  # Seconds the n-call loop takes with `pad` extra frames under it (the
  # profiler, if any, started around it). It runs in a fresh thread, whose
  # stack holds only the harness's few frames, so that depth 10 is
  # reachable. Every measurement and the depth probe go through here, so
  # they all sample the same stack shape.
  def timed_loop(target, variant, pad, n, raw: RAW)
    loop_method = :"#{target}_#{variant}"
    Thread.new do
      start(target, raw)
      begin
        Bench.descend(pad) do
          t0 = Bench.now
          send(loop_method, n)
          Bench.now - t0
        end
      ensure
        stop(target)
      end
    end.value
  end

  # Frames above which padding starts: the depth Strobe records with pad 0.
  def base_depth(variant)
    timed_loop(:strobe, variant, 0, 1, raw: true)
    Strobe.results[:raw].first
  end

  def pad_for(depth, variant)
    pad = depth - base_depth(variant)
    raise ArgumentError, "depth #{depth} is below the harness's own #{depth - pad} frames" if pad.negative?

    pad
  end

  # Length of the first raw stack, or nil without raw.
  def recorded_depth(result)
    result[:raw]&.first
  end

  # ---- wall clock ---------------------------------------------------------

  def measure(depth, variant)
    pad = pad_for(depth, variant)
    times = Hash.new { |h, k| h[k] = [] }
    results_times = Hash.new { |h, k| h[k] = [] }
    depths = {}
    targets = CALLS.keys
    REPS.times do |rep|
      targets.rotate(rep).each do |target|
        GC.start
        times[target] << timed_loop(target, variant, pad, N)
        next if target == :empty

        result = nil
        results_times[target] << Bench.time { result = results(target) }
        check(target, result, depth, variant)
        depths[target] = recorded_depth(result)
        result = nil
      end
    end
    empty = Bench.median(times[:empty])
    row = { depth: depth, variant: variant, empty_ns: empty / N * 1e9, depths: depths }
    %i[strobe stackprof].each do |target|
      row[target] = (Bench.median(times[target]) - empty) / N * 1e9
      row[:"#{target}_results"] = Bench.median(results_times[target]) / N * 1e9
    end
    row
  end

  def check(target, result, depth, variant)
    problems = []
    problems << "#{result[:samples]} samples, expected #{N}" if result[:samples] != N
    problems << "#{result[:missed_samples]} missed samples" if result[:missed_samples].to_i.positive?
    got = recorded_depth(result)
    problems << "recorded depth #{got}, expected #{depth}" if got && got != depth
    return if problems.empty?

    warn "WARNING #{target} (depth #{depth}, #{variant} stack): #{problems.join(', ')}"
  end

  def wall_clock
    Bench.header("Cost of one sample (custom mode, raw: #{RAW}): N=#{N} samples per run, median of #{REPS} runs")
    rows = DEPTHS.product(VARIANTS).map do |depth, variant|
      measure(depth, variant).tap { |row| $stderr.print "." }
    end
    $stderr.puts
    Bench.table(
      ["depth", "stack", "empty loop ns/iter", "Strobe ns/sample", "stackprof ns/sample", "ratio",
       "Strobe results() ns/sample", "stackprof results() ns/sample"],
      rows.map do |r|
        [r[:depth], r[:variant], fmt(r[:empty_ns]), fmt(r[:strobe]), fmt(r[:stackprof]),
         Bench.ratio(r[:strobe], r[:stackprof]), fmt(r[:strobe_results]), fmt(r[:stackprof_results])]
      end
    )
    puts
    puts "ns/sample = (median loop time with the profiler - median loop time calling an empty method) / N."
    puts "depth = frames in each recorded stack, including the sample method itself."
    puts "ratio = Strobe / stackprof; budget: under #{format('%.3f', BUDGET)}."
    puts "results() columns: building the result Hash afterwards, spread over the N samples (not in ns/sample)."
    verdict(rows.map { |r| [r[:depth], r[:variant], r[:strobe], r[:stackprof]] })
  end

  def fmt(value)
    format("%.1f", value)
  end

  def verdict(rows)
    over = rows.reject { |_, _, ours, theirs| theirs.positive? && ours / theirs < BUDGET }
    if over.empty?
      puts "All ratios are within budget."
    else
      over.each { |depth, variant, ours, theirs| puts "OVER BUDGET: depth #{depth}, #{variant} stack: ratio #{Bench.ratio(ours, theirs)}" }
    end
  end

  # ---- callgrind ----------------------------------------------------------

  # Child process: one loop of n calls at the given padding, then exit.
  def child(target, variant, pad, n)
    timed_loop(target.to_sym, variant.to_sym, Integer(pad), Integer(n))
    $stdout.flush
    exit!(0)
  end

  # Runs the child under callgrind and returns its total instruction count.
  def callgrind_ir(dir, target, variant, pad, n)
    out, = Bench.callgrind(__FILE__, dir, "#{target}.#{variant}.#{pad}", target, variant, pad, n)
    Bench.callgrind_total(out)
  end

  def callgrind
    abort "valgrind is not installed" unless system("valgrind --version", out: File::NULL, err: File::NULL)

    n = CALLGRIND_N
    Bench.header("Instructions per sample under callgrind (custom mode, raw: #{RAW}): N=#{n}")
    jobs = DEPTHS.product(VARIANTS).flat_map do |depth, variant|
      pad = pad_for(depth, variant)
      CALLS.keys.map { |target| [depth, variant, pad, target] }
    end
    ir = Dir.mktmpdir("strobe-callgrind") do |dir|
      Bench.in_parallel(jobs, JOBS) { |_, variant, pad, target| callgrind_ir(dir, target, variant, pad, n) }
           .transform_keys { |depth, variant, _, target| [depth, variant, target] }
    end
    rows = DEPTHS.product(VARIANTS).map do |depth, variant|
      base = ir[[depth, variant, :empty]]
      ours, theirs = %i[strobe stackprof].map { |t| (ir[[depth, variant, t]] - base).fdiv(n) }
      [depth, variant, ours, theirs]
    end
    Bench.table(
      ["depth", "stack", "Strobe Ir/sample", "stackprof Ir/sample", "ratio"],
      rows.map { |d, v, ours, theirs| [d, v, format("%.0f", ours), format("%.0f", theirs), Bench.ratio(ours, theirs)] }
    )
    puts
    puts "Ir/sample = (Ir(N samples) - Ir(same loop, N calls to an empty method, 0 samples)) / N,"
    puts "Ir = total instructions of the whole ruby process (callgrind 'totals:'). Budget: ratio under #{format('%.3f', BUDGET)}."
    verdict(rows)
  end
end

if $PROGRAM_NAME == __FILE__
  case ARGV.first
  when "--child" then SampleCost.child(*ARGV.drop(1))
  when "--callgrind" then SampleCost.callgrind
  when nil then SampleCost.wall_clock
  else abort "usage: ruby -Ilib bench/sample_cost.rb [--callgrind]"
  end
end
