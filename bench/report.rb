# frozen_string_literal: true

# Report speed, Strobe vs stackprof on the same data in the same run: a
# generated raw profile of BENCH_SAMPLES samples (bench/report_data.rb: about
# 4,800 frames, stacks 10 to 60 deep, realistic runs), then each report
# written to /dev/null, BENCH_REPS times each (more for a report taking
# under 50 ms: see measure), median reported:
#
#   text          Strobe::Report#print_text     StackProf::Report#print_text
#   method        #print_method(name)           #print_method(name)
#   graphviz      #print_graphviz               #print_graphviz (both node_fraction 0.005)
#   callgrind     #print_callgrind              #print_callgrind
#   stackcollapse #print_stackcollapse          #print_stackcollapse
#   flamegraph    #print_flamegraph (HTML)      #print_d3_flamegraph (HTML)
#
# Each time includes Report.new. stackprof's print_stackcollapse prints to
# $stdout and empties the raw array it is given, so it gets a copy (not
# timed) and $stdout is pointed at /dev/null. Budget for Strobe: at least 20
# times faster than stackprof on each report.
#
#   ruby -Ilib bench/report.rb
#
# Settings: BENCH_SAMPLES (1000000), BENCH_REPS (5; stackprof's
# stackcollapse, which takes minutes at a million samples, runs once),
# BENCH_REPORTS (all; or a comma-separated list such as "text,method").

require_relative "bench_helper"
require_relative "report_data"

module ReportBench
  SAMPLES = Bench.env_int("BENCH_SAMPLES", 1_000_000)
  REPS = Bench.env_int("BENCH_REPS", 5)
  BUDGET = 20.0
  ONLY = ENV.fetch("BENCH_REPORTS", "").split(",").map(&:strip).reject(&:empty?)

  module_function

  def null
    @null ||= File.open(File::NULL, "w")
  end

  # Median seconds of the block's runs: reps of them, and more (up to 101)
  # while they add up to under a quarter of a second, so a report taking
  # under a millisecond is not judged by five runs and their first-touch
  # page faults. setup (untimed) runs before each.
  def measure(reps, setup: -> {})
    times = []
    while times.size < reps || (times.sum < 0.25 && times.size < 101)
      arg = setup.call
      times << Bench.time { yield arg }
    end
    Bench.median(times)
  end

  def ms(seconds)
    format(seconds < 0.01 ? "%.2f" : "%.1f", seconds * 1000)
  end

  def with_stdout(io)
    saved = $stdout
    $stdout = io
    yield
  ensure
    $stdout = saved
  end

  def cases(result, name)
    {
      "text" => [-> { Strobe::Report.new(result).print_text(null) },
                 -> { StackProf::Report.new(result).print_text(false, nil, nil, nil, nil, nil, null) }],
      "method" => [-> { Strobe::Report.new(result).print_method(null, name) },
                   -> { StackProf::Report.new(result).print_method(name, null) }],
      # The same nodes in both: those with at least 0.5 % of the samples.
      "graphviz" => [-> { Strobe::Report.new(result).print_graphviz(null, node_fraction: 0.005) },
                     -> { StackProf::Report.new(result).print_graphviz({ node_fraction: 0.005 }, null) }],
      "callgrind" => [-> { Strobe::Report.new(result).print_callgrind(null) },
                      -> { StackProf::Report.new(result).print_callgrind(null) }],
      "stackcollapse" => [-> { Strobe::Report.new(result).print_stackcollapse(null) }, :stackcollapse],
      "flamegraph" => [-> { Strobe::Report.new(result).print_flamegraph(null) },
                       -> { StackProf::Report.new(result).print_d3_flamegraph(null) }],
    }
  end

  def stackprof_stackcollapse(result)
    reps = SAMPLES > 200_000 ? 1 : REPS
    measure(reps, setup: -> { result.merge(raw: result[:raw].dup) }) do |copy|
      with_stdout(null) { StackProf::Report.new(copy).print_stackcollapse }
    end
  end

  def run
    Bench.header("Report speed on a generated profile of #{SAMPLES} samples, median of #{REPS}")
    build = Bench.time { @result = ReportData.build(samples: SAMPLES) }
    result = @result
    # The busiest method with a name no other frame contains (stackprof
    # matches names as substrings).
    names = result[:frames].values.map { |f| f[:name] }
    name = result[:frames].values.sort_by { |f| -f[:total_samples] }
                          .map { |f| f[:name] }.find { |n| names.count { |m| m.include?(n) } == 1 }
    puts format("%d frames, %d raw entries, built in %.1f s; method: %s", result[:frames].size,
                result[:raw].size, build, name)
    chosen = cases(result, name)
    unknown = ONLY - chosen.keys
    abort "BENCH_REPORTS: unknown report #{unknown.join(', ')} (known: #{chosen.keys.join(', ')})" unless unknown.empty?
    chosen = chosen.slice(*ONLY) unless ONLY.empty?
    rows = chosen.map do |label, (ours, theirs)|
      print "."
      ours_s = measure(REPS) { ours.call }
      theirs_s = theirs == :stackcollapse ? stackprof_stackcollapse(result) : measure(REPS) { theirs.call }
      [label, ours_s, theirs_s]
    end
    puts
    Bench.table(%w[report Strobe\ ms stackprof\ ms times\ faster],
                rows.map { |label, ours, theirs| [label, ms(ours), ms(theirs), format("%.1f", theirs / ours)] })
    rows.each do |label, ours, theirs|
      verdict = theirs / ours >= BUDGET ? "within budget" : "UNDER budget"
      puts format("%s: %.1f times faster, budget at least %.0f: %s", label, theirs / ours, BUDGET, verdict)
    end
  end
end

ReportBench.run if $PROGRAM_NAME == __FILE__
