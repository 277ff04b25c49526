# frozen_string_literal: true

require "test_helper"
require "tmpdir"
require "strobe/sampling_prof"

# Profiling toggled by a signal (Strobe.toggle_on, STROBE_SIGNAL), the
# on_result: callback, and the SamplingProf format.
class TestToggle < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("strobe-toggle")
  end

  def teardown
    Strobe.toggle_off
    Strobe.stop
    Strobe.results
    FileUtils.remove_entry(@dir)
  end

  def signal(name = :USR2)
    before = Strobe.running? # (the trap may run as soon as kill returns)
    Process.kill(name, Process.pid)
    # The trap handler runs on this thread at its next safe point.
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    sleep 0.01 until Strobe.running? != before || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
  end

  # Each start and each stop says so in a line on stderr, the stop naming
  # the file written.
  def test_each_signal_starts_or_stops_and_each_stop_writes_a_file
    Strobe.toggle_on(:USR2, mode: :custom, path: File.join(@dir, "p.json"))
    refute Strobe.running?
    _, err = capture_io do
      signal
      assert Strobe.running?
      2.times { Strobe.sample }
      signal
      refute Strobe.running?
      signal
      Strobe.sample
      signal
    end
    started = "strobe: on USR2: profiling started (mode custom); send USR2 again to stop\n"
    assert_equal [started, "strobe: on USR2: profiling stopped; profile written to #{File.join(@dir, 'p.json')}\n",
                  started, "strobe: on USR2: profiling stopped; profile written to #{File.join(@dir, 'p-2.json')}\n"],
                 err.lines
    assert_equal %w[p-2.json p.json], Dir.children(@dir).sort
    assert_equal 2, Strobe.load(File.join(@dir, "p.json"))[:samples]
    assert_equal 1, Strobe.load(File.join(@dir, "p-2.json"))[:samples]
    assert Strobe.toggle_off
    refute Strobe.toggle_off
    assert_equal "DEFAULT", Signal.trap(:USR2, "DEFAULT"), "the signal's previous handler is back"
  end

  # A profile the toggle did not start (the program's own, a middleware's)
  # is not its to stop: the signal says so and leaves it running, and the
  # program's own stop and results still get it.
  def test_a_profile_someone_else_started_is_left_alone
    Strobe.toggle_on(:USR2, mode: :custom, path: File.join(@dir, "p.json"))
    Strobe.start(mode: :custom)
    Strobe.sample
    _, err = capture_io do
      Process.kill(:USR2, Process.pid)
      sleep 0.01 until $stderr.string.include?("\n") # (capture_io's StringIO)
    end
    assert_equal "strobe: on USR2: not stopping: the profile running was not started by USR2\n", err
    assert Strobe.running?
    assert Strobe.stop
    assert_equal 1, Strobe.results[:samples]
    assert_empty Dir.children(@dir)
  end

  # Nor does it take a profile the program stopped and has not yet taken
  # (a start would add to it, and the next signal save it as the toggle's).
  def test_a_stopped_profile_waiting_for_its_results_is_left_alone
    Strobe.toggle_on(:USR2, mode: :custom, path: File.join(@dir, "p.json"))
    Strobe.start(mode: :custom)
    Strobe.sample
    Strobe.stop
    _, err = capture_io do
      Process.kill(:USR2, Process.pid)
      sleep 0.01 until $stderr.string.include?("\n") # (capture_io's StringIO)
    end
    assert_equal "strobe: on USR2: not starting: another profile is running, or a stopped one waits for " \
                 "Strobe.results\n", err
    refute Strobe.running?
    assert_equal 1, Strobe.results[:samples]
    assert_empty Dir.children(@dir)
  end

  # A stop whose profile cannot be written says the profile is lost.
  def test_a_profile_that_cannot_be_written_is_said_lost
    File.write(File.join(@dir, "file"), "")
    target = File.join(@dir, "file", "p.json") # under a regular file: no directory can be made
    Strobe.toggle_on(:USR2, mode: :custom, path: target)
    _, err = capture_io do
      signal
      Strobe.sample
      signal
    end
    assert_match(%r{\Astrobe: on USR2: profiling stopped; the profile is lost: it could not be written to #{Regexp.escape(target)} \(.*File exists}, err.lines.last)
    refute Strobe.running?
  end

  def test_a_directory_gets_files_named_by_mode_pid_and_time
    Strobe.toggle_on("SIGUSR1", mode: :custom, raw: true, format: :sampling_prof, path: "#{@dir}/")
    _, err = capture_io do
      signal(:USR1)
      Strobe.sample
      signal(:USR1)
    end
    names = Dir.children(@dir)
    assert_equal "strobe: on USR1: profiling stopped; profile written to #{File.join(@dir, names.first)}\n", err.lines.last
    assert_equal 1, names.size
    assert_match(/\Astrobe-custom-#{Process.pid}-\d{8}-\d{6}-\d{3}-\d+\.txt\z/, names.first)
    chunks = File.read(File.join(@dir, names.first)).split("\n\n")
    assert_equal 4, chunks.size
  end

  def test_on_result_gets_each_result_off_the_profiled_thread
    results = Queue.new
    Strobe.toggle_on(:USR2, mode: :custom, on_result: ->(r) { results << [Thread.current, r[:samples]] })
    _, err = capture_io do
      signal
      3.times { Strobe.sample }
      signal
    end
    assert_equal "strobe: on USR2: profiling stopped; the result goes to on_result\n", err.lines.last
    thread, samples = results.pop
    refute_equal Thread.current, thread
    assert_equal 3, samples
    assert_empty Dir.children(@dir)
  end

  def test_bad_toggles
    assert_raises(ArgumentError) { Strobe.toggle_on(:NOPE) }.then { |e| assert_match(/not a signal name/, e.message) }
    assert_raises(ArgumentError) { Strobe.toggle_on(:URG) }.then { |e| assert_match(/the one Strobe samples with/, e.message) }
    assert_raises(ArgumentError) { Strobe.toggle_on(:USR2, mode: :fast) }.then { |e| assert_match(/mode/, e.message) }
    assert_raises(ArgumentError) { Strobe.toggle_on(:USR2, out: "x") }.then { |e| assert_match(/use path:/, e.message) }
    assert_raises(ArgumentError) { Strobe.toggle_on(:USR2, path: 3) }
    refute Strobe.toggle_off, "nothing was installed"
  end

  # Zlib takes a lock, which Ruby refuses in a trap handler: a gzipped
  # profile (a .gz name, pprof) was lost ("can't be called from trap
  # context"). It is written on a thread of its own, which the program
  # waits for at exit: this one ends as soon as the second signal is taken.
  def test_gzipped_profiles_are_written_too_even_as_the_program_ends
    [["p.json.gz", {}], ["p.pb.gz", { format: :pprof }]].each do |name, options|
      target = File.join(@dir, name)
      code = <<~RUBY
        require "strobe"
        Strobe.toggle_on(:USR2, mode: :wall, raw: true, path: #{target.inspect}, **#{options.inspect})
        Process.kill(:USR2, Process.pid)
        sleep 0.01 until Strobe.running?
        x = 0
        200_000.times { x += 1 }
        Process.kill(:USR2, Process.pid)
        sleep 0.01 while Strobe.running?
      RUBY
      out, err, status = run_ruby(code)
      assert status.success?, err
      assert_equal "", out
      # Said at once, and once written (the writing takes time).
      assert_equal ["strobe: on USR2: profiling stopped; writing #{target}\n", "strobe: on USR2: profile written to #{target}\n"],
                   err.lines.last(2)
      bytes = File.binread(target)
      assert_equal "\x1f\x8b".b, bytes[0, 2]
      if options[:format] == :pprof
        assert_operator Zlib.gunzip(bytes).bytesize, :>, 0
      else
        assert_equal :wall, Strobe.load(target)[:mode]
      end
    end
  end

  # The issue's acceptance: a running program, signalled twice from
  # outside, leaves one valid profile, and says when it starts and stops.
  def test_signal_a_running_program_twice
    stop_file = File.join(@dir, "stop")
    code = <<~RUBY
      def busy = 2_000.times { |i| i.to_s }
      busy until File.exist?(#{stop_file.inspect})
    RUBY
    env = { "RUBYOPT" => "-rstrobe/autorun", "STROBE_SIGNAL" => "USR2", "STROBE_MODE" => "cpu",
            "STROBE_OUT" => "#{@dir}/profiles/" }
    FileUtils.mkdir_p("#{@dir}/profiles")
    stopped = nil
    Open3.popen3(env, RbConfig.ruby, "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}", "-e", code) do |stdin, _out, err, wait|
      stdin.close
      line = -> { Timeout.timeout(60) { err.gets } } # a safeguard against a hang
      begin
        assert_match(/send SIGUSR2 to #{wait.pid} to start or stop profiling/, line.call)
        Process.kill(:USR2, wait.pid)
        assert_equal "strobe: on USR2: profiling started (mode cpu); send USR2 again to stop\n", line.call
        sleep 0.3 # some samples
        Process.kill(:USR2, wait.pid)
        stopped = line.call
      ensure
        File.write(stop_file, "") # the program ends, whatever happened
      end
      assert wait.value.success?, err.read
      assert_match(%r{\Astrobe: on USR2: profiling stopped; profile written to #{Regexp.escape(@dir)}/profiles/strobe-cpu-#{wait.pid}-[-\d]+\.json\n\z},
                   stopped)
    end
    files = Dir["#{@dir}/profiles/*"]
    assert_equal 1, files.size
    assert_includes stopped, files.first
    result = Strobe.load(files.first)
    assert_equal :cpu, result[:mode]
    assert_operator result[:samples], :>, 0
    assert(result[:frames].values.any? { |f| f[:name] == "Object#busy" })
  end

  def test_on_result_and_format_options
    results = Queue.new
    Strobe.start(mode: :custom, on_result: ->(r) { results << r })
    Strobe.sample
    assert Strobe.stop
    assert_equal 1, results.pop[:samples]
    assert_nil Strobe.results, "the result went to on_result"
    io = StringIO.new
    Strobe.run(mode: :custom, raw: true, out: io, format: :sampling_prof) { Strobe.sample }
    assert_equal 4, io.string.split("\n\n").size
    assert_raises(ArgumentError) { Strobe.start(format: :yaml) }.then { |e| assert_match(/format/, e.message) }
    # Refused at start, not at results time when the profile would be lost;
    # without raw: at all, the format turns it on.
    assert_raises(ArgumentError) { Strobe.start(format: :sampling_prof, raw: false) }.then { |e| assert_match(/needs raw: true/, e.message) }
    Strobe.run(mode: :custom, out: io = StringIO.new, format: :sampling_prof) { Strobe.sample }
    assert_equal 4, io.string.split("\n\n").size
    # on_result gets the Hash even when out: is given too (which is written).
    path = File.join(@dir, "both.json")
    Strobe.run(mode: :custom, out: path, on_result: ->(r) { results << r }) { Strobe.sample }
    assert_kind_of Hash, results.pop
    assert_equal 1, Strobe.load(path)[:samples]
    assert_raises(ArgumentError) { Strobe.start(on_result: 5) }.then { |e| assert_match(/on_result/, e.message) }
  end

  def descend(n, &block) = n.zero? ? yield : descend(n - 1, &block)

  # The four chunks, from a profile whose counts are known: 3 samples under
  # a three-deep recursion, 1 outside it.
  def test_sampling_prof_format
    result = Strobe.run(mode: :custom, raw: true) do
      3.times { descend(2) { Strobe.sample } }
      Strobe.sample
    end
    io = StringIO.new
    Strobe::SamplingProf.write(result, io)
    runtime, map, counts, graph = io.string.split("\n\n")
    stamps = result[:raw_sample_timestamps]
    assert_equal ((stamps.last - stamps.first) / 1000).to_s, runtime
    id_of = map.lines.to_h { |line| element, id = line.chomp.rpartition(",").values_at(0, 2); [element, id.to_i] }
    by_name = ->(name) { id_of.select { |element, _| element.end_with?(":#{name}") }.values }
    counts = counts.lines.to_h { |line| id, self_count, total = line.split(",").map(&:to_i); [id, [self_count, total]] }
    assert_equal 4, counts.values.sum(&:first), "self counts add up to the samples"
    sample_ids = by_name.call("Strobe.sample")
    assert_equal [[4, 4]], sample_ids.map { |id| counts[id] }
    descend_ids = by_name.call("TestToggle#descend")
    assert_equal [[0, 3]], descend_ids.map { |id| counts[id] }, "one line of code, total once per sample"
    edges = graph.lines.map { |line| line.split(",").map(&:to_i) }
    assert_includes edges, [descend_ids.first, descend_ids.first, 3], "direct recursion is id,id"
    assert_raises(ArgumentError) { Strobe::SamplingProf.write(result.except(:raw, :stacks), StringIO.new) }
    expanded = StringIO.new
    Strobe::SamplingProf.write(Strobe.expand(result), expanded)
    assert_equal io.string, expanded.string, "the same from the raw arrays as from the compact form"
  end
end
