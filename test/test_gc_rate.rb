# frozen_string_literal: true

require "test_helper"

# GC time in :wall and :cpu is counted by GC hooks (gcspan.c), at the
# sampling rate whatever becomes of the signals: at interval 100 about half
# the signals sent during GC were lost before.
class TestGcRate < Minitest::Test
  INTERVAL = 100

  def setup
    @heap = Array.new(300_000) { |i| "s#{i}" }
  end

  def gc_samples(result)
    result[:frames].values.select { |f| f[:name].start_with?("(") }.sum { |f| f[:samples] }
  end

  # The block's time in intervals, by the wall clock and by the thread's
  # CPU clock.
  def measure
    clocks = [Process::CLOCK_MONOTONIC, Process::CLOCK_THREAD_CPUTIME_ID]
    from = clocks.map { |c| Process.clock_gettime(c, :nanosecond) }
    result = yield
    [result, *clocks.zip(from).map { |c, f| (Process.clock_gettime(c, :nanosecond) - f) / (INTERVAL * 1000) }]
  end

  # All but a few microseconds of the thread's CPU time in the block is GC:
  # its GC samples come to at least the intervals of that time (in :wall,
  # GC's wall time is no shorter), and never to more than the intervals of
  # the block's time in the mode's clock. (Not at least the block's wall
  # time in :wall: on a loaded machine the thread also waits to run between
  # GCs, as much as 23% of the block once in CI.)
  def test_gc_is_sampled_at_the_requested_rate
    %i[wall cpu].each do |mode|
      result, wall, cpu = measure { Strobe.run(mode: mode, interval: INTERVAL, raw: true) { 8.times { GC.start } } }
      samples = gc_samples(result)
      assert_operator samples, :<=, (mode == :wall ? wall : cpu) + 1, "#{mode}: more GC samples than intervals"
      assert_operator samples, :>=, cpu * 0.9, "#{mode}: #{samples} GC samples in #{cpu} intervals of CPU time " \
                                               "(#{result[:missed_samples]} missed)"
      assert_equal result[:samples], result[:raw_timestamp_deltas].size
      phases = result[:frames].values.map { |f| f[:name] }.grep(/\A\(/)
      assert_includes phases, "(marking)", mode
      assert_includes phases, "(sweeping)", mode
    end
  end

  # Each thread's raw samples stay in time order, GC ones included.
  def test_gc_samples_are_in_time_order
    result = Strobe.run(mode: :wall, interval: INTERVAL, raw: true) do
      4.times { @heap.map(&:upcase).size; GC.start }
    end
    times = result[:raw_sample_timestamps]
    refute_empty times
    result[:raw_sample_threads].zip(times).group_by(&:first).each do |thread, samples|
      stamps = samples.map(&:last)
      assert_equal stamps.sort, stamps, "thread #{thread}: a sample earlier than the one before it"
    end
  end

  def test_ignore_gc_leaves_gc_out
    result = Strobe.run(mode: :wall, interval: INTERVAL, ignore_gc: true) { 5.times { GC.start } }
    assert_equal 0, gc_samples(result)
  end
end
