# frozen_string_literal: true

require "test_helper"
require "stringio"
require "tmpdir"

# mode: :trace: every call counted and timed, exactly.
class TestTrace < Minitest::Test
  module Work
    module_function

    def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)

    def leaf = 1

    def twice = [leaf, leaf]

    def napper(seconds) = sleep(seconds)

    def wrapper = helper_that_is_excluded

    def helper_that_is_excluded = [leaf, leaf, leaf]

    def fail_deep(n) = n.zero? ? raise(ArgumentError, "deep") : fail_deep(n - 1)

    def napper_after_yield(pause)
      Fiber.yield if pause
      sleep 0.02
    end
  end

  def trace(**options, &block)
    Strobe.run(mode: :trace, **options, &block)
  end

  def frame(result, name)
    found = result[:frames].select { |_, f| f[:name] == name }
    assert_equal 1, found.size, "one frame named #{name}: #{result[:frames].values.map { |f| f[:name] }}"
    found.first
  end

  def test_fib_calls_are_exact_and_self_times_add_up
    result = trace { Work.fib(20) }
    assert_equal :trace, result[:mode]
    assert_equal :wall, result[:clock]
    id, fib = frame(result, "TestTrace::Work.fib")
    assert_equal 21_891, fib[:calls]
    assert_equal __FILE__, fib[:file]
    # fib's total is its self time plus its callees' (recursion once):
    # Integer#<, #- and #+ and the calls of fib below the outermost.
    callees = %w[Integer#< Integer#- Integer#+].map { |name| frame(result, name)[1] }
    assert_equal [21_891, 21_890, 10_945], callees.map { |f| f[:calls] }
    sum = fib[:self_time] + callees.sum { |f| f[:total_time] }
    assert_in_delta fib[:total_time], sum, fib[:total_time] * 0.01
    assert_equal 21_890, fib[:edges][id], "fib calls itself 21,890 times"
    assert_equal 0.0, fib[:call_times][id], "that time is inside the outermost fib already"
    assert_equal 21_891, result[:frames].values.find { |f| f[:name] == "Integer#<" }[:calls]
    assert_operator fib[:total_time], :<=, result[:duration] / 1e6, "recursion counted once in total time"
  end

  def test_edges_count_calls_and_time
    result = trace { 3.times { Work.twice } }
    twice_id, twice = frame(result, "TestTrace::Work.twice")
    leaf_id, leaf = frame(result, "TestTrace::Work.leaf")
    assert_equal 3, twice[:calls]
    assert_equal 6, leaf[:calls]
    assert_equal({ leaf_id => 6 }, twice[:edges].select { |callee, _| callee == leaf_id })
    assert_in_delta leaf[:total_time], twice[:call_times][leaf_id], 1e-9
    assert result[:frames].values.none? { |f| f[:name] == "Strobe.run" }, "the call that started tracing is not traced"
    refute_nil twice_id
  end

  # Two trace files merge: calls and times add up, per thread too.
  def test_trace_files_merge
    a = trace { Work.fib(10) }
    b = trace { Work.fib(11) }
    merged = Strobe::Merge.results([a, b])
    fib = merged[:frames].values.find { |f| f[:name] == "TestTrace::Work.fib" }
    assert_equal 177 + 287, fib[:calls]
    assert_in_delta [a, b].sum { |r| frame(r, "TestTrace::Work.fib")[1][:total_time] }, fib[:total_time], 1e-9
    assert_equal [464], merged[:threads].values.map { |t| t[:frames].values.find { |f| f[:calls] == 464 }&.fetch(:calls) }.compact
    assert_raises(ArgumentError) { Strobe::Merge.results([a, trace(clock: :cpu) { Work.leaf }]) }
  end

  def test_each_thread_separately
    result = trace do
      threads = [3, 5].map { |n| Thread.new { n.times { Work.leaf } } }
      threads.each(&:join)
      2.times { Work.leaf }
    end
    leaf_id, leaf = frame(result, "TestTrace::Work.leaf")
    assert_equal 10, leaf[:calls]
    per_thread = result[:threads].values.map { |t| t[:frames].dig(leaf_id, :calls) }.compact.sort
    assert_equal [2, 3, 5], per_thread
    assert_equal 1, result[:threads].values.count { |t| t[:main] }
  end

  # A fiber's calls stay on its own stack: switching in and out of fibers
  # mid-call changes no count, and a call open across a switch is not
  # charged with the other fiber's time.
  def test_fibers_keep_their_own_stacks
    skip_fibers_under_valgrind
    result = trace do
      fiber = Fiber.new do
        Work.twice
        Fiber.yield Work.napper(0.03)
        Work.twice
      end
      fiber.resume
      Work.twice
      Work.napper(0.01)
      fiber.resume
    end
    assert_equal 3, frame(result, "TestTrace::Work.twice")[1][:calls]
    assert_equal 6, frame(result, "TestTrace::Work.leaf")[1][:calls]
    napper = frame(result, "TestTrace::Work.napper")[1]
    assert_equal 2, napper[:calls]
    assert_operator napper[:total_time], :>=, 0.04
    result[:frames].each_value do |f|
      assert_operator f[:self_time], :>=, 0, f[:name]
      assert_operator f[:total_time], :>=, f[:self_time] - 1e-9, f[:name]
    end
  end

  def test_exceptions_unwind_the_stack
    result = trace do
      Work.fail_deep(5)
    rescue ArgumentError
      Work.leaf
    end
    assert_equal 6, frame(result, "TestTrace::Work.fail_deep")[1][:calls]
    assert_equal 1, frame(result, "TestTrace::Work.leaf")[1][:calls]
  end

  # exclude: names, patterns and paths; an excluded method's time is its
  # caller's and its callees are its caller's callees.
  def test_exclude
    result = trace(exclude: ["TestTrace::Work.helper_that_is_excluded", /Integer#/]) do
      Work.wrapper
      Work.fib(5)
    end
    names = result[:frames].values.map { |f| f[:name] }
    refute_includes names, "TestTrace::Work.helper_that_is_excluded"
    assert names.none? { |n| n.start_with?("Integer#") }, names.inspect
    wrapper_id, wrapper = frame(result, "TestTrace::Work.wrapper")
    leaf_id, = frame(result, "TestTrace::Work.leaf")
    assert_equal 3, wrapper[:edges][leaf_id], "the excluded helper's callees are the wrapper's"
    refute_nil wrapper_id

    by_path = trace(exclude: [__dir__]) { Work.twice; [1].map(&:to_s) }
    assert_equal(%w[<cfunc>], by_path[:frames].values.map { |f| f[:file] }.uniq)
  end

  # The CPU clock does not run while a thread sleeps.
  def test_cpu_clock
    result = trace(clock: :cpu) { Work.napper(0.05) }
    assert_equal :cpu, result[:clock]
    sleep_frame = frame(result, "Kernel#sleep")[1]
    assert_operator sleep_frame[:total_time], :<, 0.05
    wall = trace { Work.napper(0.05) }
    assert_operator frame(wall, "Kernel#sleep")[1][:total_time], :>=, 0.05
  end

  def test_reports_and_files
    result = trace { Work.fib(10) }
    io = StringIO.new
    Strobe::Report.new(result).print_text(io)
    assert_match(/Mode: trace\(wall\)/, io.string)
    assert_match(/^\s+177\s+[\d.]+\s+\([\d.]+%\)\s+[\d.]+\s+\([\d.]+%\)\s+TestTrace::Work\.fib$/, io.string)
    dot = StringIO.new
    Strobe::Report.new(result).print_graphviz(dot)
    assert_match(/TestTrace::Work\.fib\\n177 calls\\ntotal [\d.]+ ms/, dot.string)
    assert_match(/-> f\d+ \[label="176 calls"\]/, dot.string)
    method = StringIO.new
    Strobe::Report.new(result).print_method(method, "TestTrace::Work.fib")
    assert_match(/calls: 177, self: [\d.]+ ms/, method.string)
    callgrind = StringIO.new
    Strobe::Report.new(result).print_callgrind(callgrind)
    assert_match(/^events: Microseconds$/, callgrind.string)
    assert_match(/^cfn=Integer#<\ncalls=177 0$/, callgrind.string)
    files = StringIO.new
    Strobe::Report.new(result).print_files(files)
    # (named by its absolute path, whether Ruby was given a relative one or not)
    assert_match(/^\s+177\s+[\d.]+\s+\(\s*[\d.]+%\)\s+#{Regexp.escape(File.expand_path(__FILE__))}$/, files.string)

    Dir.mktmpdir do |dir|
      path = File.join(dir, "trace.json.gz")
      Strobe.save(result, path)
      loaded = Strobe.load(path)
      assert_equal result[:frames].transform_values { |f| f.slice(:name, :calls, :total_time, :self_time, :edges) },
                   loaded[:frames].transform_values { |f| f.slice(:name, :calls, :total_time, :self_time, :edges) }
      assert_equal result[:threads], loaded[:threads]
      assert_equal :wall, loaded[:clock]
    end
  end

  # The tracer keeps classes, names, Threads and fibers in C memory while
  # the traced code allocates: a GC (compacting) at every allocation.
  def test_survives_gc_at_every_allocation
    skip_fibers_under_valgrind
    # (Not inside a fiber: a full GC on a fiber's small machine stack can
    # overflow it under GC.stress, tracing or not.)
    fiber = Fiber.new { Work.twice; Fiber.yield; Work.twice }
    result = trace do
      fiber.resume
      under_gc_stress do
        Class.new { def self.made = Work.leaf }.made
        Object.new.tap { |o| def o.single = Work.leaf }.single
      end
      fiber.resume
    end
    assert_equal 6, frame(result, "TestTrace::Work.leaf")[1][:calls]
    assert_equal 2, frame(result, "TestTrace::Work.twice")[1][:calls]
  end

  # Found in review, each failing before its fix.

  # The hook runs no Ruby code: an object whose class cannot be inspected,
  # or a BasicObject, traces like any other; singleton methods of objects
  # share one entry per class and do not keep their objects alive.
  def test_objects_with_singleton_methods
    basic = BasicObject.new
    def basic.foo = 42
    anonymous = Class.new do
      def self.inspect = raise("inspect must not be called")
      def hi = 1
    end
    big = Class.new { def initialize = @data = "x" * 10_000 }
    result = trace do
      assert_equal 42, basic.foo
      anonymous.new.hi
      500.times { o = big.new; def o.go = 1; o.go }
      GC.start
      assert_operator ObjectSpace.each_object(big).count, :<, 500, "traced objects are not kept"
    end
    names = result[:frames].values.map { |f| f[:name] }
    assert_includes names, "BasicObject#foo (singleton)"
    assert(names.any? { |n| n.match?(/\A#<Class:0x\h+>#hi\z/) }, names.inspect)
    go = result[:frames].values.select { |f| f[:name].end_with?("#go (singleton)") }
    assert_equal [500], go.map { |f| f[:calls] }
  end

  # Another thread stopping and collecting the trace while a thread is in
  # the hook making a new method's entry (it used to free the tables under
  # it: a crash every run).
  def test_stopping_while_other_threads_meet_new_methods
    5.times do
      Strobe.start(mode: :trace)
      stop = false
      worker = Thread.new { until stop; o = Object.new; def o.x = 1; o.x; Class.new { def y = 2 }.new.y; end }
      sleep 0.02
      Strobe.stop
      assert_kind_of Hash, Strobe.results
      stop = true
      worker.join
    end
  end

  # The same method open in two fibers: each call's time counts.
  def test_recursion_is_counted_per_fiber
    skip_fibers_under_valgrind
    result = trace do
      f1 = Fiber.new { Work.napper_after_yield(true) }
      f2 = Fiber.new { Work.napper_after_yield(false) }
      f1.resume
      f2.resume
      f1.resume
    end
    work = frame(result, "TestTrace::Work.napper_after_yield")[1]
    sleeps = frame(result, "Kernel#sleep")[1]
    assert_equal 2, work[:calls]
    assert_operator work[:total_time], :>=, sleeps[:total_time]
  end

  # Fibers are not kept: many enumerators come and go.
  def test_many_enumerators
    skip_fibers_under_valgrind
    result = trace { 20_000.times { e = [1, 2].each; e.next; e.next } }
    assert_equal 40_000, frame(result, "Enumerator#next")[1][:calls]
  end

  def test_a_trace_keeps_the_settings_of_its_first_round
    Strobe.start(mode: :trace)
    Strobe.stop
    assert_raises(ArgumentError) { Strobe.start(mode: :trace, clock: :cpu) }.then { |e| assert_match(/take its results first/, e.message) }
    assert Strobe.start(mode: :trace)
    Strobe.stop
    assert_equal :wall, Strobe.results[:clock]
  end

  def test_exclude_paths_end_at_directory_boundaries
    result = trace(exclude: ["."]) { Work.twice; [1].map(&:to_s) }
    names = result[:frames].values.map { |f| f[:name] }
    assert_includes names, "Array#map", "C methods have no path to exclude"
    refute_includes names, "TestTrace::Work.twice"
    partial = trace(exclude: [File.join(__dir__, "test_tra")]) { Work.twice }
    assert_includes partial[:frames].values.map { |f| f[:name] }, "TestTrace::Work.twice", "a prefix is a whole name"
  end

  def test_options
    assert_raises(ArgumentError) { Strobe.start(mode: :trace, interval: 100) }.then { |e| assert_match(/:interval/, e.message) }
    assert_raises(ArgumentError) { Strobe.start(mode: :trace, raw: true) }.then { |e| assert_match(/:raw/, e.message) }
    assert_raises(ArgumentError) { Strobe.start(mode: :trace, clock: :sundial) }.then { |e| assert_match(/clock/, e.message) }
    assert_raises(ArgumentError) { Strobe.start(mode: :trace, exclude: [3]) }.then { |e| assert_match(/exclude/, e.message) }
    assert_raises(ArgumentError) { Strobe.start(mode: :wall, clock: :cpu) }.then { |e| assert_match(/mode: :trace/, e.message) }
    assert_raises(ArgumentError) { Strobe.start(mode: :trace, format: :pprof) }.then { |e| assert_match(/built from samples/, e.message) }
    assert_raises(ArgumentError) { Strobe.start(mode: :trace, format: "firefox") }
    refute Strobe.running?
    # one at a time: a trace waiting for its results blocks sampling
    Strobe.start(mode: :trace)
    refute Strobe.start(mode: :wall), "already running"
    Strobe.stop
    assert_raises(Strobe::Error) { Strobe.start(mode: :wall) }
    assert_equal :trace, Strobe.results[:mode]
    assert Strobe.run(mode: :custom) { Strobe.sample }
  end
end
