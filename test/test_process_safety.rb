# frozen_string_literal: true

require "test_helper"

# Things that can crash or hang a profiled program run in child processes,
# each with a timeout.
class TestProcessSafety < Minitest::Test
  BUSY = <<~RUBY
    def busy(seconds)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      x
    end
  RUBY

  def assert_clean_exit(out, err, status)
    assert status.success?, "child failed (#{status.inspect}):\n#{err}"
    refute_match(/\[BUG\]|Segmentation|Abort/, err)
    out
  end

  def test_fork_child_stops_and_parent_keeps_profiling
    out = assert_clean_exit(*run_ruby(<<~RUBY))
      require "strobe"
      #{BUSY}
      def after_fork = busy(0.3)
      Strobe.start(mode: :wall, interval: 200, raw: true)
      busy(0.1)
      pid = fork do
        $stdout.sync = true
        print "child-running=\#{Strobe.running?} "
        busy(0.2) # no timer follows us here: a signal would find no handler state
        # The parent's profile is the parent's to report: not the child's.
        print "child-results=\#{Strobe.results.inspect} "
        print "child-start=\#{Strobe.start(mode: :custom)} "
        Strobe.sample
        Strobe.stop
        exit!(Strobe.results[:samples] == 1 ? 0 : 3)
      end
      after_fork
      Process.wait(pid)
      print "child-status=\#{$?.exitstatus} "
      Strobe.stop
      r = Strobe.results
      after = r[:frames].values.find { |f| f[:name] == "Object#after_fork" }
      print "parent-after-fork=\#{after && after[:total_samples] > 0}"
    RUBY
    assert_includes out, "child-running=false"
    assert_includes out, "child-results=nil"
    assert_includes out, "child-start=true"
    assert_includes out, "child-status=0"
    assert_includes out, "parent-after-fork=true"
  end

  # A forked child does not inherit what the parent's start was given for
  # its results (out:, metadata): its own profile is its own.
  # A forked child whose profile is started by another of its threads
  # samples its main thread (Ruby 3.1 reports the parent's tid for it:
  # the thread that forked is the child's first, its tid the child's pid).
  def test_a_forked_child_profiled_from_another_thread_samples_its_main_thread
    out = assert_clean_exit(*run_ruby(<<~RUBY))
      require "strobe"
      #{BUSY}
      def child_work = busy(0.6)
      Strobe.start(mode: :cpu, raw: true)
      # (Under ASan, a fork while the timer thread just started is still
      # inside ASan's thread setup leaves its allocator locked in the child.)
      busy(0.1)
      pid = fork do
        starter = Thread.new { Strobe.start(mode: :cpu, interval: 1000, raw: true) }
        starter.join
        child_work
        Strobe.stop
        r = Strobe.results
        work = r[:frames].values.find { |f| f[:name] == "Object#child_work" }
        print "child-main-sampled=\#{work && work[:total_samples] > 0}"
      end
      Process.wait(pid)
      Strobe.stop
    RUBY
    assert_equal "child-main-sampled=true", out
  end

  def test_a_forked_child_does_not_write_to_the_parents_out_file
    Dir.mktmpdir do |dir|
      out = assert_clean_exit(*run_ruby(<<~RUBY))
        require "strobe"
        Strobe.start(mode: :custom, out: #{File.join(dir, 'parent.json').inspect}, metadata: { who: "parent" })
        Strobe.sample
        pid = fork do
          Strobe.start(mode: :custom)
          Strobe.sample
          Strobe.stop
          r = Strobe.results
          exit!(r.is_a?(Hash) && r[:samples] == 1 && r[:metadata].empty? ? 0 : 3)
        end
        Process.wait(pid)
        print "child=\#{$?.exitstatus} "
        Strobe.stop
        print "parent=\#{Strobe.results.inspect}"
      RUBY
      assert_includes out, "child=0"
      assert_equal 1, Strobe.load(File.join(dir, "parent.json"))[:samples], "the parent's file is the parent's"
    end
  end

  def test_exit_while_profiling
    out = assert_clean_exit(*run_ruby(<<~RUBY))
      require "strobe"
      #{BUSY}
      Strobe.start(mode: :wall, interval: 50, raw: true)
      busy(0.2)
      puts "exiting"
      exit 0
    RUBY
    assert_equal "exiting\n", out
  end

  def test_exit_from_a_thread_while_profiling
    out = assert_clean_exit(*run_ruby(<<~RUBY))
      require "strobe"
      #{BUSY}
      Strobe.start(mode: :cpu, interval: 50)
      Thread.new { busy(0.1) }.join
      busy(0.1)
      puts "done"
    RUBY
    assert_equal "done\n", out
  end

  def test_exec_while_profiling
    5.times do
      out = assert_clean_exit(*run_ruby(<<~RUBY))
        require "strobe"
        #{BUSY}
        Strobe.start(mode: :wall, interval: 20)
        busy(0.05)
        exec(#{RbConfig.ruby.inspect}, "-e", "sleep 0.05; puts :replaced")
      RUBY
      assert_equal "replaced\n", out
    end
  end

  def test_late_signal_after_stop_is_harmless
    out = assert_clean_exit(*run_ruby(<<~RUBY))
      require "strobe"
      Strobe.run(mode: :wall, interval: 100) { sleep 0.05 }
      3.times { Process.kill(Strobe::Native::SIGNAL, Process.pid) }
      sleep 0.05
      puts "alive"
    RUBY
    assert_equal "alive\n", out
  end

  def test_start_stop_many_times
    out = assert_clean_exit(*run_ruby(<<~RUBY))
      require "strobe"
      #{BUSY}
      200.times do |i|
        Strobe.start(mode: i.even? ? :wall : :cpu, interval: 100, raw: i % 3 == 0)
        busy(0.002)
        Strobe.stop
      end
      r = Strobe.results
      puts r[:samples] > 0
    RUBY
    assert_equal "true\n", out
  end

  def test_previous_ignore_disposition_is_kept
    out = assert_clean_exit(*run_ruby(<<~RUBY))
      require "strobe"
      trap(Strobe::Native::SIGNAL, "IGNORE")
      Strobe.run(mode: :wall, interval: 1000) { sleep 0.01 }
      Process.kill(Strobe::Native::SIGNAL, Process.pid)
      puts "ignored"
    RUBY
    assert_equal "ignored\n", out
  end

  def test_exit_with_pending_samples_in_object_mode
    out = assert_clean_exit(*run_ruby(<<~RUBY))
      require "strobe"
      Strobe.start(mode: :object, interval: 1, raw: true)
      a = Array.new(10_000) { |i| "x\#{i}" }
      puts a.size
    RUBY
    assert_equal "10000\n", out
  end

  # Under YJIT before Ruby 3.3, reading a running thread's frames from the
  # signal handler crashed the VM (every run at 10 kHz, on 3.1): such
  # threads are now sampled at their next safe point, while threads blocked
  # in C code are still read from the handler.
  def test_yjit_programs_are_sampled_without_crashing
    _, _, probe = run_ruby("exit(defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? 0 : 1)", ruby_args: ["--yjit"])
    skip "this Ruby has no YJIT" unless probe.success?

    code = <<~RUBY
      require "strobe"
      def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
      %i[cpu wall].each do |mode|
        sleeper = Thread.new { Thread.current.name = "sleeper"; sleep 0.6 }
        sleep 0.01
        r = Strobe.run(mode: mode, interval: 100, raw: true) do
          t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          fib(18) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 0.4
        end
        sleeper.join
        fib = r[:frames].values.find { |f| f[:name] == "Object#fib" }
        slept = r[:threads].values.find { |t| t[:name] == "sleeper" }
        puts [mode, fib && fib[:total_samples] > 100, mode == :cpu ? slept.nil? : slept[:samples] > 100].inspect
      end
    RUBY
    assert_ruby_prints "[:cpu, true, true]\n[:wall, true, true]\n", code, ruby_args: ["--yjit"], timeout: 120
  end
end
