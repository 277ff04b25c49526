# frozen_string_literal: true

# Export speed on generated raw profiles of BENCH_SAMPLES samples
# (bench/report_data.rb: about 4,800 frames, stacks 10 to 60 deep, runs of
# repeated stacks), each export streamed to /dev/null, median of BENCH_REPS
# runs, with the output's size. Two shapes of the same stacks:
#
#   call-site lines  a caller's line is that of its call to the next frame,
#                    only the leaf's varies: what programs give (some
#                    thousands of distinct (frame, line) stack nodes...)
#   random lines     every frame of every raw entry on a line of its own:
#                    over 3 million distinct stack nodes, the worst case
#
# The exports:
#
#   pprof        Strobe::Report#print_pprof (gzipped profile.proto)
#   firefox      Strobe::Report#print_firefox (Firefox Profiler JSON)
#   speedscope   Strobe::Report#print_speedscope (speedscope JSON)
#
# stackprof writes none of these formats. The nearest thing a stackprof user
# has is speedscope's own importer for stackprof's JSON dump, so the
# speedscope row also times stackprof's print_json of the same result (the
# file that user would hand speedscope, which then converts it in the
# browser). Budget: each export "well under a second" for a million samples.
#
#   ruby -Ilib bench/export.rb
#
# Settings: BENCH_SAMPLES (1000000), BENCH_REPS (3), BENCH_THREADS (4: the
# samples are dealt to that many threads in runs, so the per-thread tables
# of the Firefox and speedscope exports are exercised).

require_relative "bench_helper"
require_relative "report_data"

module ExportBench
  SAMPLES = Bench.env_int("BENCH_SAMPLES", 1_000_000)
  REPS = Bench.env_int("BENCH_REPS", 3)
  THREADS = Bench.env_int("BENCH_THREADS", 4)
  BUDGET = 1.0

  # Counts what is written, and throws it away.
  class Sink
    attr_reader :bytes

    def initialize
      @bytes = 0
    end

    def write(data)
      @bytes += data.bytesize
      data.bytesize
    end

    def puts(data)
      write("#{data}\n")
    end

    def flush = self
  end

  module_function

  # The generated result with its samples dealt to THREADS threads, in runs
  # of 100 samples, as threads take turns.
  def with_threads(result)
    ids = Array.new(THREADS) { |i| 1000 + i }
    n = result[:raw_sample_threads].size
    result[:raw_sample_threads] = Array.new(n) { |k| ids[(k / 100) % THREADS] }
    result[:threads] = ids.to_h { |id| [id, { name: "worker #{id}", samples: 0 }] }
    result[:raw_sample_threads].tally.each { |id, count| result[:threads][id][:samples] = count }
    result
  end

  def measure
    sink = nil
    times = Array.new(REPS) do
      sink = Sink.new
      Bench.time { yield sink }
    end
    [Bench.median(times), sink.bytes]
  end

  def run
    Bench.header("Export speed on generated profiles of #{SAMPLES} samples, #{THREADS} threads, median of #{REPS}")
    { "call-site lines" => :call_sites, "random lines" => :random }.each do |label, lines|
      result = nil
      build = Bench.time { result = with_threads(ReportData.build(samples: SAMPLES, lines: lines)) }
      nodes = Strobe::Native.compact(result[:raw], result[:raw_lines], nil, nil, nil,
                                     result[:frames].keys.each_with_index.to_h, {}, 0)[0].size / 3
      puts
      puts format("%s: %d frames, %d raw entries, %d distinct stack nodes, built in %.1f s", label,
                  result[:frames].size, result[:raw].size, nodes, build)
      run_exports(result)
    end
  end

  def run_exports(result)
    report = Strobe::Report.new(result)
    rows = {
      "pprof" => measure { |io| report.print_pprof(io) },
      "firefox" => measure { |io| report.print_firefox(io) },
      "speedscope" => measure { |io| report.print_speedscope(io) },
    }
    stackprof_json = measure { |io| StackProf::Report.new(result).print_json(io) }
    Bench.table(%w[export Strobe\ s output\ MB stackprof\ s note],
                rows.map do |name, (seconds, bytes)|
                  theirs = name == "speedscope" ? format("%.2f", stackprof_json[0]) : "-"
                  note = name == "speedscope" ? "stackprof: its JSON dump, which speedscope converts itself" : "no stackprof export"
                  [name, format("%.2f", seconds), format("%.1f", bytes / 1e6), theirs, note]
                end)
    rows.each do |name, (seconds, _)|
      verdict = seconds < BUDGET ? "within budget" : "OVER budget"
      puts format("%s: %.2f s for %d samples, budget under %.1f s: %s", name, seconds, SAMPLES, BUDGET, verdict)
    end
    ratio = stackprof_json[0] / rows["speedscope"][0]
    puts format("speedscope file: Strobe %.2f s, stackprof's JSON dump %.2f s (%.1f times as long; %.1f MB)",
                rows["speedscope"][0], stackprof_json[0], ratio, stackprof_json[1] / 1e6)
  end
end

ExportBench.run if $PROGRAM_NAME == __FILE__
