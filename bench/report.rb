# frozen_string_literal: true

# Report speed, Strobe vs stackprof on the same data in the same run: a
# generated raw profile of BENCH_SAMPLES samples (bench/report_data.rb: about
# 4,800 frames, stacks 10 to 60 deep, realistic runs), then each report
# written to /dev/null, BENCH_REPS times each, median reported:
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
# stackcollapse, which takes minutes at a million samples, runs once).

require_relative "bench_helper"
require_relative "report_data"

module ReportBench
  SAMPLES = Bench.env_int("BENCH_SAMPLES", 1_000_000)
  REPS = Bench.env_int("BENCH_REPS", 5)
  BUDGET = 20.0

  module_function

  def null
    @null ||= File.open(File::NULL, "w")
  end

  # Median seconds of reps runs of the block; setup (untimed) runs before each.
  def measure(reps, setup: -> {})
    Bench.median(Array.new(reps) do
      arg = setup.call
      Bench.time { yield arg }
    end)
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
    rows = cases(result, name).map do |label, (ours, theirs)|
      print "."
      ours_s = measure(REPS) { ours.call }
      theirs_s = theirs == :stackcollapse ? stackprof_stackcollapse(result) : measure(REPS) { theirs.call }
      [label, ours_s, theirs_s]
    end
    puts
    Bench.table(%w[report Strobe\ ms stackprof\ ms times\ faster],
                rows.map { |label, ours, theirs| [label, format("%.1f", ours * 1000), format("%.1f", theirs * 1000), format("%.1f", theirs / ours)] })
    rows.each do |label, ours, theirs|
      verdict = theirs / ours >= BUDGET ? "within budget" : "UNDER budget"
      puts format("%s: %.1f times faster, budget at least %.0f: %s", label, theirs / ours, BUDGET, verdict)
    end
  end
end

ReportBench.run if $PROGRAM_NAME == __FILE__
