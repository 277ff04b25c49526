# frozen_string_literal: true

# GC at a high sampling rate: how many samples each profiler records while
# a program does nothing but GC, against the intervals that passed. Strobe
# counts GC time from GC hooks (ext/strobe/gcspan.c); stackprof takes its
# samples from a process-wide timer's signals. Run from the repository
# root: ruby -Ilib bench/gc_rate.rb
#
# Settings: GC_RATE_INTERVAL (microseconds, 100), GC_RATE_STRINGS (a heap
# of this many strings, 300,000), GC_RATE_GCS (GC.start calls per run, 20),
# GC_RATE_ROUNDS (3, the median is shown).
require_relative "bench_helper"

interval = Bench.env_int("GC_RATE_INTERVAL", 100)
strings = Bench.env_int("GC_RATE_STRINGS", 300_000)
gcs = Bench.env_int("GC_RATE_GCS", 20)
rounds = Bench.env_int("GC_RATE_ROUNDS", 3)
heap = Array.new(strings) { |i| "s#{i}" }

# [samples recorded, intervals of the run, missed] for one run of the
# profiler (a proc given the work as a block).
def measure(profiler, interval, gcs)
  result = nil
  work = -> { gcs.times { GC.start } }
  seconds = Bench.time { result = profiler.call(work) }
  [result[:samples], seconds * 1_000_000 / interval, result[:missed_samples].to_i]
end

profilers = {
  "strobe :wall" => ->(work) { Strobe.run(mode: :wall, interval: interval, &work) },
  "stackprof :wall" => ->(work) { StackProf.run(mode: :wall, interval: interval, &work) },
}

Bench.header("GC at interval #{interval} us: #{gcs} GC.start on #{strings} strings, median of #{rounds}")
rows = profilers.map do |name, profiler|
  runs = Array.new(rounds) { measure(profiler, interval, gcs) }
  samples = Bench.median(runs.map { |r| r[0] })
  intervals = Bench.median(runs.map { |r| r[1] })
  ms = intervals * interval / 1000.0
  [name, format("%.0f", ms), samples.round, intervals.round, runs.map { |r| r[2] }.max, Bench.ratio(samples, intervals)]
end
Bench.table(["profiler", "ms per run", "samples", "intervals", "missed (max)", "samples/intervals"], rows)
puts
puts "Strobe records #{Bench.ratio(rows.first[5].to_f, rows.last[5].to_f)} times stackprof's share of the intervals " \
     "spent in GC; the same GCs took #{Bench.ratio(rows.first[1].to_f, rows.last[1].to_f)} times as long under Strobe."
heap.size
