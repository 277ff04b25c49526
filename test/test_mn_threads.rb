# frozen_string_literal: true

require_relative "test_helper"
require "json"

# Ruby 3.3+'s M:N threads (RUBY_MN_THREADS=1): Ruby threads take turns on
# shared native threads, so neither a kernel tid nor a kernel CPU clock
# belongs to one of them. Samples must still go to the Ruby thread they were
# taken on, each thread's CPU time must follow it across native threads,
# and no thread may be lost or merged with another. Each test runs in a
# child started with RUBY_MN_THREADS=1 (Ruby reads it at boot), and once
# without it, where the same work must give the same split.
class TestMNThreads < Minitest::Test
  # Four threads splitting 40/30/20/10: in :cpu, a fixed amount of work
  # (their CPU time cannot be read from Ruby under M:N: the thread CPU clock
  # is the native thread's); in :wall, sleeping for 0.4/0.3/0.2/0.1 s, which
  # under M:N no signal can read (their stacks are noted as they block).
  # Prints, as JSON, each worker's share of the samples, its share of the
  # CPU time its own clock measured (the truth without M:N; under M:N the
  # clock is its native thread's, shared), whether two workers ran on one
  # native thread (as Ruby reports it), the workers' names and the result's
  # thread ids.
  SPLIT = <<~RUBY
    require "strobe"
    require "json"
    def work(n)
      x = 0
      n.times { |i| x += i & 7 }
      x
    end
    work(100_000) # warm up
    mode = ARGV.fetch(0).to_sym
    seen = Queue.new # [worker, native thread id], at its start and end
    cpu = {}
    clock = Process::CLOCK_THREAD_CPUTIME_ID
    result = Strobe.run(mode: mode, interval: 1000) do
      [4, 3, 2, 1].each_with_index.map do |share, i|
        Thread.new do
          Thread.current.name = "worker\#{i}"
          seen << [i, Thread.current.native_thread_id]
          start = Process.clock_gettime(clock)
          mode == :wall ? sleep(share * 0.1) : work(share * 2_000_000)
          cpu["worker\#{i}"] = Process.clock_gettime(clock) - start
          seen << [i, Thread.current.native_thread_id]
        end
      end.each(&:join)
    end
    pairs = []
    pairs << seen.pop until seen.empty?
    # Whether two workers ran on one native thread: M:N scheduling.
    shared = pairs.group_by(&:last).any? { |_, on| on.map(&:first).uniq.size > 1 }
    workers = result[:threads].values.select { |t| t[:name].to_s.start_with?("worker") }
    total = workers.sum { |t| t[:samples] }
    puts JSON.generate(shares: workers.to_h { |t| [t[:name], 100.0 * t[:samples] / total] }, shared: shared,
                       cpu: cpu.transform_values { |c| 100.0 * c / cpu.values.sum },
                       names: workers.map { |t| t[:name] }, ids: result[:threads].keys)
  RUBY

  def setup
    skip "M:N threads need Ruby 3.3+" if RUBY_VERSION < "3.3"
    skip_statistics_under_valgrind
  end

  # code that, with M:N threads, leaves with exit! once it has printed:
  # Ruby 4.0.5 itself sometimes crashes as a process with M:N threads exits
  # (SIGSEGV, no report: 3 of 9 runs of a thread-churning script that never
  # loads Strobe, 2026-11-24), and these tests are about sampling, not exit.
  def mn_exit(code, mn)
    mn ? "#{code}\n$stdout.flush\nexit!(0)" : code
  end

  def split(mode, mn:)
    out, err, status = run_ruby(mn_exit(SPLIT, mn), env: { "RUBY_MN_THREADS" => mn ? "1" : nil }, timeout: 120,
                                                    args: [mode.to_s])
    assert status.success?, "#{status.inspect}: #{err}"
    JSON.parse(out.lines.last, symbolize_names: true)
  end

  WORKERS = %i[worker0 worker1 worker2 worker3].freeze

  # Each worker's share of the samples is within 3 points of expected
  # ({worker => percent}).
  def assert_split(report, expected)
    assert_equal WORKERS.map(&:to_s), report[:names].sort, "each worker once: #{report.inspect}"
    assert_equal report[:ids].uniq, report[:ids]
    WORKERS.each do |w|
      assert_in_delta expected.fetch(w), report[:shares].fetch(w), 3.0, "#{w}: #{report[:shares]} against #{expected}"
    end
  end

  NOMINAL = WORKERS.zip([40, 30, 20, 10]).to_h.freeze

  # Under M:N no clock tells a Ruby thread's CPU time from Ruby, so the
  # work's nominal split is the truth; what a unit of work costs varies a
  # little with the machine's load from run to run, so each worker's share
  # is the median of three runs.
  def test_cpu_split_under_mn_threads
    reports = Array.new(3) { split(:cpu, mn: true) }
    assert reports.all? { |r| r[:shared] }, "workers took turns on a native thread (else M:N was not on)"
    median = WORKERS.to_h { |w| [w, reports.map { |r| r[:shares].fetch(w) }.sort[1]] }
    assert_split(reports.first.merge(shares: median), NOMINAL)
  end

  def test_wall_split_under_mn_threads
    report = split(:wall, mn: true)
    assert report[:shared], "workers took turns on a native thread (else M:N was not on)"
    assert_split(report, NOMINAL)
  end

  # Without M:N each worker's own CPU clock is the truth for :cpu.
  def test_the_same_split_without_mn_threads
    report = split(:cpu, mn: false)
    refute report[:shared], "without M:N each thread has a native thread of its own"
    assert_split(report, report[:cpu])
    # The clock, not the nominal split, is the truth here: under load (ASan,
    # a second CI lane) a thread waiting for the GVL burns CPU of its own, so
    # the split drifts from 40/30/20/10 (30/42/15/13 once). What the check
    # needs is a split uneven enough that equal shares would fail it.
    spread = report[:cpu].values.max - report[:cpu].values.min
    assert_operator spread, :>=, 12, "the work splits unevenly: #{report}"
    report = split(:wall, mn: false)
    assert_split(report, NOMINAL)
  end

  # Runs code in a child with RUBY_MN_THREADS=1 (or, mn: false, without
  # it); the last line it prints, parsed as JSON.
  def child_report(code, mn: true, args: [])
    code = mn_exit("require 'json'\n#{code}", mn)
    out, err, status = run_ruby(code, env: { "RUBY_MN_THREADS" => mn ? "1" : nil }, args: args, timeout: 120)
    assert status.success?, "#{status.inspect}: #{err}"
    JSON.parse(out.lines.last, symbolize_names: true)
  end

  # An M:N thread that blocks gives up its native thread: no signal can read
  # it then. Its time blocked must still be charged to where it blocked (a
  # stack noted as it left the GVL), as without M:N: here 400 ms in sleep,
  # about 340 ms in Queue#pop and 160 ms computing.
  BLOCKS = <<~RUBY
    require "strobe"
    def work(n) = (x = 0; n.times { |i| x += i & 7 }; x)
    def computes
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      work(10_000) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 0.08
    end
    def sleeps = sleep(0.4)
    def pops(q) = q.pop
    r = Strobe.run(mode: :wall, interval: 1000) do
      q = Queue.new
      a = Thread.new { Thread.current.name = "A"; computes; sleeps; computes; pops(q) }
      sleep 0.9
      q << 1
      a.join
    end
    total = ->(name) { r[:frames].values.find { |f| f[:name] == name }&.dig(:total_samples).to_i }
    thread = r[:threads].values.find { |t| t[:name] == "A" }
    puts JSON.generate(samples: thread[:samples], computes: total.("Object#computes"), sleeps: total.("Object#sleeps"),
                       pops: total.("Object#pops"))
  RUBY

  def test_blocked_time_is_charged_to_where_a_thread_blocked
    [true, false].each do |mn|
      report = child_report(BLOCKS, mn: mn)
      assert_operator report[:sleeps], :>=, 300, "mn: #{mn}: #{report}"
      assert_operator report[:pops], :>=, 200, "mn: #{mn}: #{report}"
      assert_operator report[:computes], :<, report[:samples] / 3, "mn: #{mn}: #{report}"
    end
  end

  # Threads blocked since before profiling started (a pool waiting for
  # work) are sampled at every tick from the first, M:N or not.
  def test_threads_blocked_since_before_start_are_sampled
    code = <<~RUBY
      require "strobe"
      q = Queue.new
      pool = Array.new(8) { |i| Thread.new { Thread.current.name = "idle\#{i}"; q.pop } }
      sleep 0.05
      r = Strobe.run(mode: :wall, interval: 1000) { sleep 0.5 }
      8.times { q << 1 }
      pool.each(&:join)
      idle = r[:threads].values.select { |t| t[:name].to_s.start_with?("idle") }
      puts JSON.generate(threads: idle.size, least: idle.map { |t| t[:samples] }.min)
    RUBY
    [true, false].each do |mn|
      report = child_report(code, mn: mn)
      assert_equal 8, report[:threads], "mn: #{mn}"
      assert_operator report[:least], :>=, 300, "mn: #{mn}: every idle thread sampled most ticks: #{report}"
    end
  end

  # CPU that other code uses on the native thread a profiled M:N thread
  # left (an unprofiled thread, here) is not charged to the profiled one.
  def test_cpu_of_other_threads_is_not_charged_to_a_blocked_thread
    code = <<~RUBY
      require "strobe"
      def work(n) = (x = 0; n.times { |i| x += i & 7 }; x)
      go = Queue.new
      q = Queue.new
      a = Thread.new { Thread.current.name = "A"; go.pop; work(1_000_000); q.pop }
      b = Thread.new { go.pop; sleep 0.1; work(20_000_000) }
      sleep 0.05
      r = Strobe.run(mode: :cpu, interval: 1000, threads: [a]) { 2.times { go << 1 }; b.join }
      q << 1
      a.join
      puts JSON.generate(samples: r[:threads].values.sum { |t| t[:samples] })
    RUBY
    # A's 1M iterations take some 25 ms of CPU; B's 20M, some 500 ms.
    assert_operator child_report(code)[:samples], :<, 100
  end

  # Ruby reads RUBY_MN_THREADS as the process starts: a program that
  # changes ENV before loading Strobe does not change how threads run.
  def test_mn_threads_are_known_from_the_environment_the_process_started_with
    code = <<~RUBY
      ENV.delete("RUBY_MN_THREADS")
      require "strobe"
      r = Strobe.run(mode: :wall) { Thread.new { sleep 0.02 }.join }
      puts JSON.generate(mn: r[:threads].values.count { |t| t[:mn] })
    RUBY
    assert_operator child_report(code)[:mn], :>=, 1
  end

  # In a child forked from a thread other than the main one, Ruby runs other
  # threads on the main thread's native thread: its samples are still its own.
  def test_a_child_forked_from_another_thread
    code = <<~RUBY
      require "strobe"
      def work(n) = (x = 0; n.times { |i| x += i & 7 }; x)
      def main_works = work(1_000_000)
      def main_sleeps = sleep(0.3)
      reader, writer = IO.pipe
      Thread.new do
        pid = fork do
          reader.close
          r = Strobe.run(mode: :wall, interval: 1000) do
            q = Queue.new
            w = Thread.new { q.pop }
            sleep 0.05
            main_works
            main_sleeps
            q << 1
            w.join
          end
          main = r[:threads].values.find { |t| t[:main] }
          total = ->(name) { r[:frames].values.find { |f| f[:name] == name }&.dig(:total_samples).to_i }
          writer.puts JSON.generate(main: main[:samples], works: total.("Object#main_works"),
                                    sleeps: total.("Object#main_sleeps"))
          writer.close
          exit!(0)
        end
        Process.wait(pid)
      end.join
      writer.close
      puts reader.read
    RUBY
    [true, false].each do |mn|
      report = child_report(code, mn: mn)
      assert_operator report[:sleeps], :>=, 200, "mn: #{mn}: #{report}"
      assert_operator report[:main], :>=, 250, "mn: #{mn}: #{report}"
    end
  end

  # Threads start and end while profiling, 100 of them, each doing enough
  # work for several samples: every one appears in the result, once.
  def test_thread_churn_under_mn_threads_loses_no_thread
    code = <<~RUBY
      require "strobe"
      def work(n) = n.times { |i| i * i }
      result = Strobe.run(mode: :cpu, interval: 500) do
        10.times do |batch|
          10.times.map { |i| Thread.new { Thread.current.name = "t\#{batch * 10 + i}"; work(600_000) } }.each(&:join)
        end
      end
      names = result[:threads].values.map { |t| t[:name].to_s }.grep(/\\At\\d+\\z/)
      # Threads took turns on native threads: ids from 2**22 up, never tids.
      p [names.size, names.uniq.size, result[:threads].keys.count { |id| id >= 2**22 } >= 10]
      p Strobe::Native.thread_registry[:slots] <= 256
    RUBY
    out, err, status = run_ruby(mn_exit(code, true), env: { "RUBY_MN_THREADS" => "1" }, timeout: 120)
    assert status.success?, "#{status.inspect}: #{err}"
    assert_equal ["[100, 100, true]", "true"], out.lines(chomp: true)
  end
end
