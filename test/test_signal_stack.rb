# frozen_string_literal: true

require "test_helper"

# Where the sampling handler runs (sigstack.c): on the thread's alternate
# signal stack, within its size, and a handler left by a longjmp (Ruby's
# stack-overflow recovery) leaves its thread sampled.
class TestSignalStack < Minitest::Test
  def spin(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    x = 0
    x += [3, 1, 2].sort.first while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    x
  end

  def after_the_jump(seconds) = spin(seconds)

  def deep(n, &block) = n.zero? ? block.call : deep(n - 1, &block)

  # Deepest use of the calling thread's alternate stack by handlers while
  # the block runs profiled: [used, size].
  def alternate_stack_use(**options)
    Strobe.start(**options)
    spin(0.05) # native: the thread gets its bigger stack as its unwinder is set up
    refute_nil Strobe::Native.signal_stack_paint, "the thread has an alternate signal stack"
    deep(100) { spin(0.3) }
    used = Strobe::Native.signal_stack_used
    Strobe.stop
    assert_operator Strobe.results[:samples], :>, 0
    used
  end

  def test_the_handler_runs_on_the_alternate_stack
    %i[wall cpu].each do |mode|
      used, size = alternate_stack_use(mode: mode, interval: 100)
      assert_operator used, :>, 0, "#{mode}: no handler ran on the alternate stack"
      # A page to spare: a wider FPU state makes the kernel's signal frame
      # bigger than here (sanitizer builds need 9 KiB of Ruby's 16 KiB).
      assert_operator used, :<=, size - 4096, "#{mode}: the handler needs #{used} of its #{size} bytes"
    end
  end

  def test_native_frames_get_room_on_a_stack_of_their_own
    skip "built without libunwind" unless Strobe::Native::NATIVE_FRAMES
    skip "M:N threads are set up as they run" if ENV["RUBY_MN_THREADS"] == "1"
    [Thread.current, nil].each do |main|
      used, size = main ? alternate_stack_use(mode: :cpu, interval: 100, native: true)
                        : Thread.new { alternate_stack_use(mode: :wall, interval: 100, native: true) }.value
      assert_operator size, :>=, 64 * 1024, "a thread sampling native frames has a 64 KiB stack"
      assert_operator used, :>, 0
      assert_operator used, :<=, size / 2, "native frames need #{used} of #{size} bytes"
    end
  end

  # Ruby's stack-overflow recovery longjmps out of a signal handler running
  # when the fault came (a fault inside it that Ruby takes for an overflow),
  # leaving the handler's signal blocked on the thread (the kernel blocks it
  # while its handler runs) and its guard held. Neither may stay so: the
  # thread, which only computes (no hook runs on it), goes on being sampled,
  # in this profile and the next.
  def test_a_handler_left_by_a_longjmp_leaves_its_thread_sampled
    Strobe.start(mode: :wall, interval: 1000, raw: true)
    reclaimed = Strobe::Native.guards_reclaimed
    recovered = Strobe::Native.handlers_recovered
    assert Strobe::Native.leave_a_handler, "the handler was left"
    # The timer thread finds the thread unanswered after 100 of its ticks,
    # which a loaded machine (the sanitizers, CI's other lane) delays:
    # computed on until then, within 10 s.
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    after_the_jump(0.05) until Strobe::Native.handlers_recovered > recovered ||
                               Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    after_the_jump(0.3)
    Strobe.stop
    result = Strobe.results
    after = result[:frames].values.find { |f| f[:name] == "TestSignalStack#after_the_jump" }
    refute_nil after, "the thread was not sampled after its handler was left"
    assert_operator after[:total_samples], :>, 0
    assert_operator Strobe::Native.guards_reclaimed, :>, reclaimed, "the guard was taken back"
    assert_operator Strobe::Native.handlers_recovered, :>, recovered, "the signal was unblocked"
    again = Strobe.run(mode: :cpu, interval: 1000) { after_the_jump(0.2) }
    assert_operator again[:samples], :>, 0, "the next profile samples the thread"
  end

  # The real thing: SystemStackError rescued while sampled at 10 kHz, with
  # native frames (the deepest handler). Before, it crashed or left the
  # thread unsampled for good.
  # The program overflows the machine stack in C (Marshal.dump recursing),
  # which Ruby 3.3 and 3.4 themselves do not survive ("[BUG] system stack
  # overflow during GC", without Strobe): there it is skipped.
  OVERFLOW = <<~RUBY
    deep = []
    at = deep
    200_000.times { inner = []; at << inner; at = inner }
    def overflow(deep)
      Marshal.dump(deep)
      :no_overflow
    rescue SystemStackError
      :rescued
    end
  RUBY

  def test_stack_overflows_while_sampled
    _, err, plain = run_ruby("#{OVERFLOW}\n10.times { overflow(deep) }")
    skip "Ruby #{RUBY_VERSION} itself crashes on this program: #{err.lines.first}" unless plain.success?
    modes = [[:wall, false, :threads], [:cpu, false, :threads]]
    modes += [[:wall, true, :threads], [:cpu, true, :threads]] if Strobe::Native::NATIVE_FRAMES
    # The process-wide timer's signal on the thread's own stack killed the
    # program ([BUG] Segmentation fault, the kernel unable to push the
    # signal's frame) in 12 runs of 24 when the handler was so installed.
    modes << [:wall, false, :process]
    modes.each do |mode, native, timer|
      out, err, status = run_ruby(<<~RUBY, timeout: 120)
        require "strobe"
        #{OVERFLOW}
        Strobe.start(mode: :#{mode}, interval: 100, timer: :#{timer}#{', native: true' if native})
        rescued = Array.new(10) { overflow(deep) }.count(:rescued)
        Strobe.stop
        first = Strobe.results[:samples]
        def afterwards = (t = Process.clock_gettime(Process::CLOCK_MONOTONIC); nil until Process.clock_gettime(Process::CLOCK_MONOTONIC) - t > 0.2)
        later = Strobe.run(mode: :#{mode}, interval: 1000) { afterwards }
        puts [rescued, first > 0, later[:samples] > 0].inspect
      RUBY
      context = "#{mode} #{timer}#{' native' if native}: #{status.inspect} #{err[0, 1500]}"
      assert status.success?, context
      assert_equal "[10, true, true]\n", out, context
    end
  end
end
