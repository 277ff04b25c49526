# frozen_string_literal: true

require "test_helper"
require "stringio"
require "tmpdir"
require "set"

# Workload for exact tests: custom-mode samples at known places.
module Workload
  module_function

  def outer(inner_samples, outer_samples)
    inner(inner_samples)
    outer_samples.times { Strobe.sample }
  end

  def inner(count)
    count.times { Strobe.sample }
  end

  def recurse(depth)
    return Strobe.sample if depth.zero?

    recurse(depth - 1)
  end

  def deliver_signals(count)
    count.times { Process.kill(Strobe::Native::SIGNAL, Process.pid) }
  end
end

# Random walks through call sites, for comparing each recorded stack with
# the stack Ruby reports at the same moment.
module Walk
  FIRST_LINE = __LINE__
  module_function

  def step(path, i, seen)
    return leaf(seen) if i == path.size

    case path[i]
    when 0 then step(path, i + 1, seen)
    when 1 then step(path, i + 1, seen) # the same method, another line
    else through { step(path, i + 1, seen) } # two more levels: a method and a block
    end
  end

  def through
    yield
  end

  # The lines of the Walk frames on the stack, root first.
  def leaf(seen)
    seen << caller_locations(1).select { |l| l.path == __FILE__ && LINES.cover?(l.lineno) }.map(&:lineno).reverse
    Strobe.sample
  end

  LINES = (FIRST_LINE..__LINE__)
end

class TestStrobe < Minitest::Test
  # Consecutive stacks share prefixes of every length, including ones that
  # differ only in a line deep inside: each sample's recorded stack must be
  # exactly the stack Ruby reported there (the recorder reuses the previous
  # stack's common part, compared several levels at a time).
  def test_every_recorded_stack_is_the_stack_sampled
    rng = Random.new(42)
    paths = Array.new(400) { Array.new(rng.rand(0..40)) { rng.rand(0..2) } }
    # Runs of repeats and near-repeats, not only random stacks.
    paths = paths.flat_map { |p| [p, p, p.dup.tap { |q| q[rng.rand(q.size)] = (q[0].to_i + 1) % 3 unless q.empty? }] }
    seen = []
    result = Strobe.run(mode: :custom, raw: true) { paths.each { |path| Walk.step(path, 0, seen) } }
    assert_equal seen.size, result[:samples]

    here = result[:frames].select { |_, f| f[:file] == File.expand_path(__FILE__) }.keys.to_set
    recorded = []
    raw, lines = result[:raw], result[:raw_lines]
    i = 0
    while i < raw.size
      depth = raw[i]
      stack = (1..depth).select { |k| here.include?(raw[i + k]) && Walk::LINES.cover?(lines[i + k]) }.map { |k| lines[i + k] }
      raw[i + depth + 1].times { recorded << stack[0...-1] } # the last is leaf's own line
      i += depth + 2
    end
    assert_equal seen.size, recorded.size
    wrong = seen.each_index.reject { |k| seen[k] == recorded[k] }
    assert_empty wrong, "sample #{wrong.first}: sampled #{seen[wrong.first].inspect}, recorded #{recorded[wrong.first].inspect}" unless wrong.empty?
    assert_operator seen.map(&:size).max, :>, 30, "deep stacks were exercised"
  end

  def test_custom_mode_counts_are_exact
    result = Strobe.run(mode: :custom) { Workload.outer(7, 3) }
    frames = frames_by_name(result)

    assert_equal 10, result[:samples]
    assert_equal 0, result[:missed_samples]
    assert_equal 0, result[:gc_samples]
    assert_nil result[:interval]
    assert_equal :custom, result[:mode]
    assert_equal 10, frames["Strobe.sample"][:samples]
    assert_equal 10, frames["Workload.outer"][:total_samples]
    assert_equal 0, frames["Workload.outer"][:samples]
    assert_equal 7, frames["Workload.inner"][:total_samples]
    # outer calls inner (7 samples) and, through a block, Integer#times (3 + 7 inside inner)
    assert_equal 7, frames["Workload.outer"][:edges][frame_id(result, "Workload.inner")]
  end

  def test_lines_are_total_and_self_per_line
    result = Strobe.run(mode: :custom) { Workload.outer(2, 1) }
    outer = frames_by_name(result)["Workload.outer"]
    line_of_inner_call = Workload.method(:outer).source_location.last + 1
    assert_equal [2, 0], outer[:lines][line_of_inner_call]
    assert_equal 2, outer[:lines].size
  end

  def descend(n, &block)
    n.zero? ? yield : descend(n - 1, &block)
  end

  # Deeper than 1024 frames: the innermost 1024 are kept under a
  # "(truncated)" root, and the result counts such samples.
  def test_deep_stacks_are_truncated_and_counted
    result = Strobe.run(mode: :custom, raw: true) do
      descend(3000) { 3.times { Strobe.sample } }
      Strobe.sample
    end
    assert_equal [4, 3], result.values_at(:samples, :truncated_samples)
    truncated_id, truncated = result[:frames].find { |_, f| f[:name] == "(truncated)" }
    assert_equal [3, 0, ""], truncated.values_at(:total_samples, :samples, :file)
    depth = result[:raw][0]
    assert_equal [1025, truncated_id, 3], [depth, result[:raw][1], result[:raw][depth + 1]]
    assert_equal "Strobe.sample", result[:frames][result[:raw][depth]][:name]
    io = StringIO.new
    Strobe::Report.new(result).print_text(io)
    assert_includes io.string, "  Truncated: 3 (75.00%), stacks deeper than 1024 frames\n"
    assert_equal 0, Strobe.run(mode: :custom) { Strobe.sample }[:truncated_samples]
  end

  def test_recursion_counts_a_frame_once_per_sample
    result = Strobe.run(mode: :custom) { 4.times { Workload.recurse(5) } }
    recurse = frames_by_name(result)["Workload.recurse"]
    assert_equal 4, result[:samples]
    assert_equal 4, recurse[:total_samples]
    # The recursive edge is counted per occurrence: 5 per sample.
    assert_equal 20, recurse[:edges][frame_id(result, "Workload.recurse")]
  end

  def test_self_delivered_signals_are_counted_exactly
    skip_statistics_under_valgrind
    Strobe.start(mode: :wall, interval: 1_000_000, raw: true)
    Workload.deliver_signals(150)
    Strobe.stop
    result = Strobe.results
    assert_equal 150, result[:samples]
    assert_equal 0, result[:missed_samples]
    assert_equal 150, frames_by_name(result)["Process.kill"][:samples]
    assert_equal 150, result[:raw_sample_timestamps].size
  end

  def test_raw_arrays_are_stackprof_shaped
    result = Strobe.run(mode: :custom, raw: true) { Workload.outer(3, 2) }
    raw = result[:raw]
    raw_lines = result[:raw_lines]
    assert_equal raw.size, raw_lines.size
    total = 0
    i = 0
    while i < raw.size
      len = raw[i]
      stack = raw[i + 1, len]
      assert stack.all? { |id| result[:frames].key?(id) }, "raw refers to a frame that is not in frames"
      assert_equal "Strobe.sample", result[:frames][stack.last][:name], "raw stacks run root to leaf"
      assert_equal raw[i + len + 1], raw_lines[i + len + 1]
      total += raw[i + len + 1]
      i += len + 2
    end
    assert_equal 5, total
    assert_equal 5, result[:raw_sample_timestamps].size
    assert_equal 5, result[:raw_timestamp_deltas].size
    stamps = result[:raw_sample_timestamps]
    assert_equal stamps, stamps.sort, "timestamps are in order"
    assert_equal stamps.each_cons(2).map { |a, b| b - a }, result[:raw_timestamp_deltas].drop(1)
  end

  def test_identical_consecutive_stacks_share_one_raw_entry
    result = Strobe.run(mode: :custom, raw: true) { Workload.inner(4) }
    # [len, frames..., 4]
    assert_equal 4, result[:raw].last
    assert_equal result[:raw][0] + 2, result[:raw].size
  end

  def test_results_accumulate_across_start_and_stop
    Strobe.start(mode: :custom)
    Workload.inner(2)
    Strobe.stop
    Strobe.start(mode: :custom)
    Workload.inner(3)
    Strobe.stop
    Strobe.start(mode: :custom)
    Workload.inner(4)
    Strobe.stop
    result = Strobe.results
    assert_equal 9, result[:samples]
    assert_nil Strobe.results, "results forgets what it returned"
  end

  def test_start_stop_running
    refute Strobe.running?
    assert Strobe.start(mode: :custom)
    assert Strobe.running?
    refute Strobe.start(mode: :custom), "start while running returns false"
    assert_nil Strobe.results, "no results while running"
    assert Strobe.stop
    refute Strobe.stop
    refute Strobe.sample, "sample when stopped"
    refute_nil Strobe.results
  end

  def test_aggregate_false_omits_edges_and_lines
    result = Strobe.run(mode: :custom, aggregate: false) { Workload.outer(2, 2) }
    result[:frames].each_value do |frame|
      refute frame.key?(:edges)
      refute frame.key?(:lines)
    end
    assert_equal 4, frames_by_name(result)["Strobe.sample"][:samples]
  end

  def test_metadata_is_returned
    result = Strobe.run(mode: :custom, metadata: { app: "shop", rev: 3 }) { Strobe.sample }
    assert_equal({ app: "shop", rev: 3 }, result[:metadata])
  end

  # The count to expect is stackprof's, sampling the same allocations at
  # the same time: both see exactly the objects Ruby's NEWOBJ event reports
  # (GC.stat(:total_allocated_objects) counts others too, differently from
  # one Ruby to the next).
  def test_object_mode_samples_every_nth_allocation
    require "stackprof"
    StackProf.start(mode: :object, interval: 10)
    Strobe.start(mode: :object, interval: 10)
    allocate_strings(5000)
    Strobe.stop
    StackProf.stop
    expected = StackProf.results[:samples]
    result = Strobe.results
    assert_equal :object, result[:mode]
    assert_equal 10, result[:interval]
    assert_operator expected, :>=, 500
    assert_in_delta expected, result[:samples], 10
    assert_operator frames_by_name(result).dig("TestStrobe#allocate_strings", :total_samples), :>=, 495
  end

  def allocate_strings(count)
    count.times.map { |i| "s#{i}" }
  end

  def test_wall_mode_samples_a_sleeping_thread
    result = Strobe.run(mode: :wall, interval: 1000, threads: [Thread.current]) { sleep 0.2 }
    assert_equal [Thread.current.native_thread_id], result[:threads].keys
    sleep_frame = frames_by_name(result)["Kernel#sleep"]
    refute_nil sleep_frame, "sleep was sampled"
    assert_operator sleep_frame[:samples], :>, result[:samples] / 2
  end

  def test_cpu_mode_samples_only_cpu_time
    skip_statistics_under_valgrind
    result = Strobe.run(mode: :cpu, interval: 1000) do
      sleep 0.1
      deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.2
      nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
    end
    frames = frames_by_name(result)
    assert_operator result[:samples], :>, 0
    sleep_samples = frames.dig("Kernel#sleep", :samples).to_i
    assert_operator sleep_samples, :<, result[:samples] / 4, "sleep uses no CPU"
  end

  # :cpu: every interval of CPU the thread used is a sample or is counted
  # missed, but for fewer than three it still owed when profiling stopped
  # (the timer sees a threshold crossed at its next tick, about an interval
  # late, and a late tick finds one more used). Keeping a debt of only one
  # interval lost a timer wake-up's lateness at every tick, silently.
  def test_cpu_mode_accounts_for_every_interval_used
    skip_statistics_under_valgrind
    clock = Process::CLOCK_THREAD_CPUTIME_ID
    used = nil
    result = Strobe.run(mode: :cpu, interval: 5000) do
      start = Process.clock_gettime(clock)
      nil while Process.clock_gettime(clock) < start + 0.6
      used = Process.clock_gettime(clock) - start
    end
    due = (used / 0.005).floor
    assert_operator result[:samples] + result[:missed_samples], :>=, due - 2,
                    "#{result[:samples]} samples, #{result[:missed_samples]} missed"
  end

  def test_gc_samples_become_gc_frames
    result = Strobe.run(mode: :wall, interval: 200) { 300.times { GC.start } }
    assert_operator result[:gc_samples], :>, 0
    frames = frames_by_name(result)
    gc = frames.fetch("(garbage collection)")
    assert_equal "", gc[:file]
    refute gc.key?(:line)
    assert_equal result[:gc_samples], gc[:total_samples]
    phases = %w[(marking) (sweeping)].sum { |name| frames.dig(name, :total_samples).to_i }
    assert_equal gc[:total_samples], gc[:samples] + phases
  end

  def test_ignore_gc_leaves_out_gc_frames
    result = Strobe.run(mode: :wall, interval: 200, ignore_gc: true) { 300.times { GC.start } }
    assert_equal 0, result[:gc_samples]
    refute frames_by_name(result).key?("(garbage collection)")
  end

  def test_frames_survive_gc_compact
    result = Strobe.run(mode: :custom, raw: true) do
      Workload.inner(3)
      GC.compact
      GC.verify_compaction_references(double_heap: true, toward: :empty) if GC.respond_to?(:verify_compaction_references)
      Workload.outer(1, 1)
    end
    frames = frames_by_name(result)
    assert_equal 5, frames["Strobe.sample"][:samples]
    assert_equal 4, frames["Workload.inner"][:total_samples]
    first_stack = result[:raw][1, result[:raw][0]].map { |id| result[:frames].fetch(id)[:name] }
    assert_includes first_stack, "Workload.inner", "frames sampled before compaction still resolve"
  end

  # A start calls Ruby (Thread.list, each thread's status), where Ruby may
  # switch threads. A start from the thread switched to found the sampler
  # not running yet and started a timer thread of its own; the first start
  # then set up the timer's lock and condition again under it, and the next
  # stop hung for good in pthread_cond_destroy (the middleware's takeovers
  # under ASan, and the review's request threads racing Strobe.run). A
  # TracePoint switches threads there on purpose: that start is refused.
  def test_a_start_from_a_thread_switched_to_inside_a_start_is_refused
    code = <<~RUBY
      main = Thread.current
      inner = :not_called
      tp = TracePoint.new(:c_call) do |t|
        next unless t.method_id == :list && Thread.current == main && inner == :not_called

        inner = :calling
        inner = Thread.new { Strobe.start(mode: :wall, interval: 1000) }.value
      end
      tp.enable
      outer = Strobe.start(mode: :wall, interval: 1000)
      tp.disable
      sleep 0.05
      Strobe.stop
      result = Strobe.results
      p [outer, inner, result[:samples] > 0]
    RUBY
    assert_ruby_prints "[true, false, true]\n", "require 'strobe'\n#{code}", timeout: 30
  end
end

class TestStrobeOptions < Minitest::Test
  def assert_rejected(message, **opts)
    error = assert_raises(ArgumentError) { Strobe.start(**opts) }
    assert_match message, error.message
    refute Strobe.running?, "a rejected start leaves the profiler stopped"
    assert_equal 1, Strobe.run(mode: :custom) { Strobe.sample }[:samples], "and usable"
  end

  # Every option, each with values of the wrong type or out of range: one
  # ArgumentError naming the option, and the profiler stays usable.
  def test_every_option_rejects_wrong_values_by_name
    wrong = {
      mode: [:fast, 1, nil, [:cpu]],
      interval: ["10", 1.5, -1, 0, 1_000_001, 2**64, [100]],
      raw: ["yes", 1, :true],
      aggregate: ["no", 0],
      ignore_gc: ["true", 1.0],
      metadata: [[1], "x", 1],
      out: [1, :file, "/nonexistent-dir/x.json", Dir.tmpdir],
      threads: [[], [1], "all", :some, Thread],
      timer: [:posix, "threads", nil],
    }
    wrong.each do |option, values|
      values.each do |value|
        error = assert_raises(ArgumentError, "#{option}: #{value.inspect}") { Strobe.start(option => value) }
        assert_match(/\b#{option}\b/, error.message, "#{option}: #{value.inspect}")
        refute Strobe.running?
      end
    end
    assert_equal 1, Strobe.run(mode: :custom) { Strobe.sample }[:samples], "still usable"
    assert_raises(ArgumentError) { Strobe.start(mode: :object, interval: 2**31) }
    assert_raises(ArgumentError) { Strobe.start(mode: :wall, bogus: 1, other: 2) }.then do |e|
      assert_match(/unknown options: :bogus, :other/, e.message)
    end
  end

  def test_unknown_option
    assert_rejected(/unknown option: :intreval/, intreval: 10)
  end

  def test_unknown_mode
    assert_rejected(/unknown mode: :fast/, mode: :fast)
  end

  def test_interval_out_of_range
    assert_rejected(/interval.*got 0/, mode: :wall, interval: 0)
    assert_rejected(/interval.*got 1000001/, mode: :cpu, interval: 1_000_001)
    assert_rejected(/interval must be an Integer/, interval: "10")
    assert_rejected(/interval for :object mode/, mode: :object, interval: 0)
  end

  def test_metadata_must_be_a_hash
    assert_rejected(/metadata must be a Hash, got Array/, metadata: [1])
  end

  def test_unwritable_out_path
    assert_rejected(/out path is not writable: .*nope/, out: "/nonexistent-dir/nope.json")
  end

  def test_run_needs_a_block
    assert_raises(ArgumentError) { Strobe.run(mode: :custom) }
    refute Strobe.running?
  end

  def test_start_refuses_a_foreign_sigprof_handler
    out, err, status = run_ruby(<<~RUBY)
      require "strobe"
      trap(Strobe::Native::SIGNAL) { }
      begin
        Strobe.start(mode: :wall)
      rescue Strobe::Error => e
        puts e.message
      end
      puts Strobe.running?
    RUBY
    assert status.success?, err
    assert_match(/SIGURG already has a handler/, out)
    assert_match(/^false$/, out)
  end
end

# The result says which JIT compiler was on.
class TestJitKey < Minitest::Test
  CODE = 'require "strobe"; r = Strobe.run(mode: :wall) { 20.times { |i| i * i } }; p r[:jit]; ' \
         'Strobe.save(r, ARGV[0]); p Strobe.load(ARGV[0])[:jit]'

  def jit_key(*ruby_args)
    Dir.mktmpdir do |dir|
      out, err, status = run_ruby(CODE, ruby_args: ruby_args, args: [File.join(dir, "p.json")])
      assert status.success?, err
      out.lines(chomp: true).uniq
    end
  end

  def jit_available?(flag, name)
    system(RbConfig.ruby, flag, "-e", "exit RubyVM::#{name}.enabled?", err: File::NULL)
  end

  def test_the_interpreter_has_no_jit_key
    assert_equal ["nil"], jit_key("--disable-all", "-rjson")
  end

  def test_yjit
    skip "this Ruby has no YJIT" unless jit_available?("--yjit", "YJIT")
    assert_equal [":yjit"], jit_key("--yjit")
  end

  def test_zjit
    skip "this Ruby has no ZJIT (Ruby 4.0+ built with it)" unless jit_available?("--zjit", "ZJIT")
    assert_equal [":zjit"], jit_key("--zjit")
  end

end
