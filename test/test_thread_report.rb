# frozen_string_literal: true

require "test_helper"
require "stringio"
require "tmpdir"
require "strobe/cli"

# Reports restricted to one thread, or to the threads of a name (Report
# thread:, strobe report --thread), and the text report's list of threads.
class TestThreadReport < Minitest::Test
  def burn(seconds)
    clock = Process::CLOCK_THREAD_CPUTIME_ID
    deadline = Process.clock_gettime(clock) + seconds
    nil while Process.clock_gettime(clock) < deadline
  end

  def burn_a = burn(0.15)
  def burn_b = burn(0.05)

  def two_thread_result(raw: true)
    skip_statistics_under_valgrind # CPU-time samples of two threads
    Strobe.run(mode: :cpu, interval: 500, raw: raw) do
      [Thread.new { Thread.current.name = "A"; burn_a }, Thread.new { Thread.current.name = "B"; burn_b }].each(&:join)
    end
  end

  def tid(result, name)
    result[:threads].find { |_, t| t[:name] == name }.first
  end

  def test_each_thread_gets_only_its_samples_and_they_add_up
    result = two_thread_result
    subsets = result[:threads].keys.map { |id| Strobe::Report.thread_result(result, id) }
    result[:threads].each_key.zip(subsets) do |id, subset|
      assert_equal result[:threads][id][:samples], subset[:samples]
      # (A thread is listed without samples for its markers alone: the main
      # thread's wait for the GVL as it starts the workers.)
      assert_equal subset[:samples].zero? ? [] : [id], subset[:raw_sample_threads].uniq
      assert_equal [id], subset[:threads].keys
      assert_equal id, subset[:thread]
    end
    assert_equal result[:samples], subsets.sum { |s| s[:samples] }

    a = subsets[result[:threads].keys.index(tid(result, "A"))]
    names = a[:frames].values.map { |f| f[:name] }
    assert_includes names, "TestThreadReport#burn_a"
    refute_includes names, "TestThreadReport#burn_b"
    # Per frame, the threads' totals add up to the whole profile's.
    result[:frames].each do |id, frame|
      assert_equal frame[:total_samples], subsets.sum { |s| s[:frames].dig(id, :total_samples).to_i }, frame[:name]
      assert_equal frame[:samples], subsets.sum { |s| s[:frames].dig(id, :samples).to_i }, frame[:name]
    end
  end

  # A thread listed without samples (one that only has markers: a GVL
  # stretch, a thread's start) gets an empty part, not the others' columns.
  def test_a_thread_without_samples_gets_an_empty_part
    result = two_thread_result
    result[:threads][999_999] = { name: "marked only", samples: 0 }
    part = Strobe::Report.thread_result(result, 999_999)
    assert_equal [0, [999_999]], [part[:samples], part[:threads].keys]
    %i[raw raw_lines raw_sample_threads raw_sample_timestamps raw_timestamp_deltas].each do |key|
      assert_equal [], part[key], key.to_s
    end
  end

  def test_a_report_for_one_thread_needs_raw_data_and_a_known_thread
    result = two_thread_result(raw: false)
    error = assert_raises(ArgumentError) { Strobe::Report.new(result, thread: tid(result, "A")) }
    assert_match(/raw: true/, error.message)
    error = assert_raises(ArgumentError) { Strobe::Report.new(result, thread: -1) }
    assert_match(/no thread -1 in this profile/, error.message)
  end

  def test_cli_report_for_one_thread
    Dir.mktmpdir do |dir|
      file = File.join(dir, "two.json")
      result = two_thread_result
      Strobe.save(result, file)
      b = tid(result, "B")
      out = StringIO.new
      err = StringIO.new
      assert_equal 0, Strobe::CLI.new(["report", file, "--thread", b.to_s], out: out, err: err).run
      assert_match(/Thread: #{b} \(B\)/, out.string)
      assert_match(/TestThreadReport#burn_b/, out.string)
      refute_match(/burn_a/, out.string)

      err = StringIO.new
      assert_equal 1, Strobe::CLI.new(["report", file, "--thread", "1"], out: StringIO.new, err: err).run
      assert_equal 1, err.string.lines.size
      assert_match(/\Astrobe: cannot report on .*no thread 1 in this profile/, err.string)
    end
  end

  # Threads by name: one, several sharing it (their samples together), the
  # main thread as "main"; a name that looks like a number but is no id.
  def named_threads_result
    Strobe.run(mode: :custom, raw: true) do
      Strobe.sample
      [["twin", 3], ["twin", 2], ["7", 4]].map do |name, samples|
        Thread.new do
          Thread.current.name = name
          samples.times { Strobe.sample }
        end
      end.each(&:join)
    end
  end

  def text(report)
    io = StringIO.new
    report.print_text(io)
    io.string
  end

  def test_threads_by_name
    result = named_threads_result
    main = result[:threads].find { |_, t| t[:main] }.first
    twins = result[:threads].select { |_, t| t[:name] == "twin" }.keys
    assert_equal 2, twins.size

    both = Strobe::Report.new(result, thread: "twin")
    assert_equal 5, both.samples
    assert_equal twins.sort, both.result[:threads].keys.sort
    assert_includes text(both), "  Thread: twin (2 threads)\n"
    assert_equal 4, Strobe::Report.new(result, thread: "7").samples, "a name, not an id"
    [main, main.to_s, "main"].each do |thread|
      report = Strobe::Report.new(result, thread: thread)
      assert_equal [1, main], [report.samples, report.result[:thread]], thread.inspect
      assert_includes text(report), "  Thread: #{main} (main)\n"
    end

    error = assert_raises(ArgumentError) { Strobe::Report.new(result, thread: "nobody") }
    assert_match(/\Ano thread "nobody" in this profile \(threads: .*\)\z/, error.message)
    assert_includes error.message, "main (#{main})"
    twins.each { |id| assert_includes error.message, "twin (#{id})" }
  end

  # The text report lists the threads, most samples first: id, samples,
  # share of the samples, name ("main" for the main thread).
  def test_the_text_report_lists_the_threads
    result = named_threads_result
    id_of = ->(name, samples) { result[:threads].find { |_, t| t[:name] == name && t[:samples] == samples }.first }
    main = result[:threads].find { |_, t| t[:main] }.first
    rows = text(Strobe::Report.new(result)).lines.drop_while { |line| !line.start_with?("  Threads") }.drop(2)
                                           .take_while { |line| !line.start_with?("=") }
    expected = [[id_of.("7", 4), 4, "40.0", "7"], [id_of.("twin", 3), 3, "30.0", "twin"],
                [id_of.("twin", 2), 2, "20.0", "twin"], [main, 1, "10.0", "main"]]
    assert_equal expected.size, rows.size, rows.join
    expected.zip(rows).each do |(id, samples, pct, name), row|
      assert_match(/\A +#{id} +#{samples} +\( ?#{pct}%\)( .*)? +#{name}\n\z/, row)
    end

    Dir.mktmpdir do |dir|
      file = File.join(dir, "named.json")
      Strobe.save(result, file)
      out = StringIO.new
      assert_equal 0, Strobe::CLI.new(["report", file, "--thread", "twin"], out: out, err: StringIO.new).run
      assert_includes out.string, "Thread: twin (2 threads)"
      assert_match(/Samples: 5 /, out.string)
    end
  end

  # (Raw arrays as stackprof has them: a result of Strobe's is read from
  # its compact form.)
  def test_corrupt_raw_data_raises_profile_error
    result = Strobe.expand(two_thread_result)
    result[:raw_sample_threads] = result[:raw_sample_threads].first(3)
    assert_raises(Strobe::ProfileError) { Strobe::Report.thread_result(result, tid(result, "A")) }
  end

  def test_huge_counts_in_raw_data_raise_profile_error
    result = Strobe.expand(two_thread_result)
    id = tid(result, "A")
    huge = result.merge(raw: [0, 2, 0, 2**63 - 1, 0, 2**60])
    assert_raises(Strobe::ProfileError) { Strobe::Report.thread_result(huge, id) }
    assert_raises(Strobe::ProfileError) do
      Strobe::Native.compact([2**63 - 1, 0], nil, nil, nil, nil, { 0 => 0 }, {}, 0)
    end
    assert_raises(Strobe::ProfileError) do
      Strobe::Native.compact([0, 2**62], nil, [1, 2], nil, nil, {}, {}, 0)
    end
  end
end
