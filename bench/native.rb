# frozen_string_literal: true

# Cost of one sample with native frames (native: true) and without, and
# stackprof's (which has no native frames) for scale: instructions under
# valgrind's callgrind, which are stable on a noisy machine (timings of
# signal-driven sampling on the development VM are dominated by the
# signals themselves, see README's Performance).
#
# Each run sends its own process N signals from a loop DEPTH Ruby frames
# deep, with the profiler started in :wall mode at a 10 ms interval (its
# timer adds some samples of its own): SIGURG for Strobe, SIGALRM for
# stackprof. Strobe runs with its process-wide timer (timer: :process),
# whose handler asks for the hand-over at once: under valgrind, which runs
# one thread at a time, its timer thread would hand samples over too late
# to keep up with a signal loop, and samples would be dropped. Two call
# sites alternate, so that consecutive stacks differ (as the leaf of a
# running program's stack does) and every sample is captured, handed over
# and recorded on its own. A sample's cost is its signal handler (with
# native: true, libunwind's walk of the native stack) plus its recording
# (with native: true, the weaving of native frames), each counted with
# everything it calls:
#
#   Ir/sample = (Ir(2N signals) - Ir(N)) / (samples(2N) - samples(N))
#   Strobe: signal_handler + drain_job; stackprof: stackprof_signal_handler
#   + stackprof_job_record_buffer
#
# The difference of two runs leaves out one-time costs (reading the symbol
# tables of libraries the first time one of their functions is named).
#
#   ruby -Ilib bench/native.rb
#
# Settings: BENCH_N (2000 signals), BENCH_DEPTH (30), BENCH_JOBS (2
# valgrind processes at a time).

require_relative "bench_helper"
require "rbconfig"
require "tmpdir"

module NativeBench
  N = Bench.env_int("BENCH_N", 2000)
  DEPTH = Bench.env_int("BENCH_DEPTH", 30)
  JOBS = Bench.env_int("BENCH_JOBS", 2)
  TARGETS = %i[strobe native stackprof].freeze
  # The functions whose inclusive instructions make up a sample.
  FUNCTIONS = {
    strobe: %w[signal_handler drain_job],
    native: %w[signal_handler drain_job],
    stackprof: %w[stackprof_signal_handler stackprof_job_record_buffer],
  }.freeze

  module_function

  def signal_loop(signal, n)
    pid = Process.pid
    i = 0
    while i < n
      if i.even?
        Process.kill(signal, pid)
      else
        Process.kill(signal, pid)
      end
      i += 1
    end
  end

  # Child process: n signals at DEPTH frames, profiled by target; prints
  # the samples and the native frames recorded.
  def child(target, n)
    target = target.to_sym
    n = Integer(n)
    case target
    when :strobe, :native
      Strobe.start(mode: :wall, interval: 10_000, native: target == :native, timer: :process) or
        raise "Strobe did not start"
    when :stackprof then StackProf.start(mode: :wall, interval: 10_000) or raise "stackprof did not start"
    end
    Bench.descend(DEPTH - 5) { signal_loop(target == :stackprof ? :ALRM : :URG, n) }
    result = case target
             when :strobe, :native then Strobe.stop && Strobe.results
             when :stackprof then StackProf.stop && StackProf.results
             end
    native = result ? result[:frames].values.count { |f| f[:native] } : 0
    puts [result ? result[:samples] : n, native].join(" ")
    $stdout.flush
    exit!(0)
  end

  # [instructions of target's sampling functions, samples, native frames]
  # of a child under callgrind.
  def callgrind(dir, target, n)
    out, printed = Bench.callgrind(__FILE__, dir, "#{target}.#{n}", target, n)
    [sampling_ir(out, FUNCTIONS.fetch(target)), *printed.split.map { |v| Integer(v) }]
  end

  # The sum of the named functions' inclusive instruction counts.
  def sampling_ir(out, functions)
    annotated = IO.popen(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out], err: File::NULL, &:read)
    counts = {}
    annotated.each_line do |line|
      next unless (m = line.match(/\A\s*([\d,]+) \([^)]*\)\s+\S*:(\w+)(?:\.[\w.]+)? \[/))

      counts[m[2]] ||= Integer(m[1].delete(","))
    end
    missing = functions - counts.keys
    raise "#{out}: no #{missing.join(', ')} in callgrind_annotate's output" unless missing.empty?

    functions.sum { |f| counts[f] }
  end

  def main
    abort "valgrind is not installed" unless system("valgrind --version", out: File::NULL, err: File::NULL)

    Bench.header("Instructions per sample under callgrind, with and without native frames " \
                 "(:wall, #{N} and #{2 * N} signals, #{DEPTH} Ruby frames deep)")
    runs = Dir.mktmpdir("strobe-native") do |dir|
      Bench.in_parallel(TARGETS.product([N, 2 * N]), JOBS) { |job| callgrind(dir, *job) }
    end
    cost = TARGETS.to_h do |t|
      [t, (runs[[t, 2 * N]][0] - runs[[t, N]][0]).fdiv(runs[[t, 2 * N]][1] - runs[[t, N]][1])]
    end
    samples = TARGETS.to_h { |t| [t, runs[[t, 2 * N]][1]] }
    Bench.table(
      ["Strobe Ir/sample", "Strobe native: true Ir/sample", "native frames add", "stackprof Ir/sample",
       "native / stackprof", "samples (2N run)", "native frames recorded"],
      [[format("%.0f", cost[:strobe]), format("%.0f", cost[:native]), format("%.0f", cost[:native] - cost[:strobe]),
        format("%.0f", cost[:stackprof]), Bench.ratio(cost[:native], cost[:stackprof]),
        %i[strobe native stackprof].map { |t| samples[t] }.join(" / "), runs[[:native, 2 * N]][2]]]
    )
    puts
    puts "Ir/sample = (Ir(2N) - Ir(N)) / (samples(2N) - samples(N)), Ir of the handler and the recording."
    puts "stackprof records no native frames: its column is its cost of a Ruby-only sample, for scale."
  end
end

if $PROGRAM_NAME == __FILE__
  case ARGV.first
  when "--child" then NativeBench.child(*ARGV.drop(1))
  when nil then NativeBench.main
  else abort "usage: ruby -Ilib bench/native.rb"
  end
end
