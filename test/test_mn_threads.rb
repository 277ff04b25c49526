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
  # Four threads doing 40/30/20/10 % of a fixed amount of work (their CPU
  # time cannot be read from Ruby under M:N: the thread CPU clock is the
  # native thread's). Prints, as JSON, each worker's share of the samples
  # (of its running samples in :wall, where waiting for the GVL counts too),
  # whether two workers ran on one native thread (as Ruby reports it), the
  # workers' names and the result's thread ids.
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
    result = Strobe.run(mode: mode, interval: 1000) do
      [4, 3, 2, 1].each_with_index.map do |share, i|
        Thread.new do
          Thread.current.name = "worker\#{i}"
          seen << [i, Thread.current.native_thread_id]
          work(share * 2_000_000)
          seen << [i, Thread.current.native_thread_id]
        end
      end.each(&:join)
    end
    pairs = []
    pairs << seen.pop until seen.empty?
    # Whether two workers ran on one native thread: M:N scheduling.
    shared = pairs.group_by(&:last).any? { |_, on| on.map(&:first).uniq.size > 1 }
    workers = result[:threads].values.select { |t| t[:name].to_s.start_with?("worker") }
    count = mode == :wall ? ->(t) { t.dig(:states, :running) || t[:samples] } : ->(t) { t[:samples] }
    total = workers.sum(&count)
    puts JSON.generate(shares: workers.to_h { |t| [t[:name], 100.0 * count.(t) / total] }, shared: shared,
                       names: workers.map { |t| t[:name] }, ids: result[:threads].keys)
  RUBY

  def setup
    skip "M:N threads need Ruby 3.3+" if RUBY_VERSION < "3.3"
    skip_statistics_under_valgrind
  end

  def split(mode, mn:)
    out, err, status = run_ruby(SPLIT, env: { "RUBY_MN_THREADS" => mn ? "1" : nil }, timeout: 120, args: [mode.to_s])
    assert status.success?, err
    JSON.parse(out.lines.last, symbolize_names: true)
  end

  def assert_split(report)
    assert_equal %w[worker0 worker1 worker2 worker3], report[:names].sort, "each worker once: #{report.inspect}"
    assert_equal report[:ids].uniq, report[:ids]
    [40, 30, 20, 10].each_with_index do |pct, i|
      assert_in_delta pct, report[:shares].fetch(:"worker#{i}"), 3.0, "worker#{i}: #{report[:shares].inspect}"
    end
  end

  def test_cpu_split_under_mn_threads
    report = split(:cpu, mn: true)
    assert report[:shared], "workers took turns on a native thread (else M:N was not on)"
    assert_split(report)
  end

  def test_wall_split_under_mn_threads
    report = split(:wall, mn: true)
    assert report[:shared], "workers took turns on a native thread (else M:N was not on)"
    assert_split(report)
  end

  def test_the_same_split_without_mn_threads
    %i[cpu wall].each do |mode|
      report = split(mode, mn: false)
      refute report[:shared], "without M:N each thread has a native thread of its own"
      assert_split(report)
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
    out, err, status = run_ruby(code, env: { "RUBY_MN_THREADS" => "1" }, timeout: 120)
    assert status.success?, err
    assert_equal ["[100, 100, true]", "true"], out.lines(chomp: true)
  end
end
