# frozen_string_literal: true

module Strobe
  class Continuous
    # Sends windows to the store on a thread of Strobe's own, never in the
    # program's: at most CAPACITY windows wait (the one being sent among
    # them); when another comes, the oldest not being sent is dropped and
    # counted (a window waiting to be sent again is not being sent), so a
    # slow or absent store costs bounded memory. A window the store may yet
    # take (no answer, 408, 429, 5xx) is sent again after a pause that
    # doubles with each failure in a row, from BACKOFF up to MAX_BACKOFF,
    # with jitter (a fleet restarted together does not retry together); one
    # it refused (another 4xx) is dropped. Failures, and the recovery after
    # them, are said in one line each at most every QUIET seconds (a store
    # that comes and goes does not fill stderr); lines are written outside
    # the lock, so a stderr nobody reads stalls nothing but this thread.
    class Uploader
      CAPACITY = 3
      BACKOFF = 1.0
      MAX_BACKOFF = 60.0
      QUIET = 60.0

      # A window's profile: gzipped pprof, its span (Times) and rate.
      Window = Struct.new(:body, :from, :till, :rate)

      # Counts, read by Continuous#stats (without the lock: a trap handler
      # may ask).
      attr_reader :uploaded, :dropped, :rejected, :failures, :bytes, :last_error

      # target: something with upload(body, from, till, rate) -> Outcome
      # (Pyroscope); note: a proc writing a line; cpu: a proc adding CPU
      # seconds to Strobe's cost.
      def initialize(target, note:, cpu:)
        @target = target
        @note = note
        @cpu = cpu
        @lock = Mutex.new
        @changed = ConditionVariable.new
        @queue = []
        @sending = false
        @closed = false
        @uploaded = @dropped = @rejected = @failures = @bytes = 0
        @streak = 0
        @last_error = nil
        @said = { failing: -Float::INFINITY, working: -Float::INFINITY }
        @failure_said = false
        @thread = Thread.new { run }
        @thread.name = "strobe continuous upload"
      end

      # Windows waiting, the one being sent among them.
      def queued
        @queue.size
      end

      # Queues a window; drops the oldest not being sent when CAPACITY wait.
      def push(window)
        @lock.synchronize do
          return if @closed

          if @queue.size >= CAPACITY
            @queue.delete_at(@sending ? 1 : 0)
            @dropped += 1
          end
          @queue << window
          @changed.broadcast
        end
      end

      # Sends what waits until it is sent or the deadline (a monotonic
      # time) passes, then ends the thread; windows left are dropped and
      # counted. A store failing now is not waited for: what waits is
      # dropped at once. Returns whether everything was sent. Again, it
      # only waits for the thread to end.
      def close(deadline)
        @lock.synchronize do
          @closed = true
          deadline = Continuous.now if @streak.positive?
          @changed.broadcast
        end
        @thread.join([deadline - Continuous.now, 0].max)
        @thread.kill
        @thread.join(1)
        @lock.synchronize do
          done = @queue.empty?
          @dropped += @queue.size # (the one being sent among them)
          @queue.clear
          done
        end
      end

      private

      def run
        Native.exclude_current_thread
        pause = nil
        while (window = next_window(pause))
          started = thread_cpu
          outcome = @target.upload(window.body, window.from, window.till, window.rate)
          @cpu.call(thread_cpu - started)
          pause, line = settle(window, outcome)
          @note.call(line) if line
        end
      rescue StandardError => e
        @note.call("the upload thread failed: #{e.class}: #{e.message}")
      end

      # The window to send next (the oldest), after pause seconds (a retry's
      # wait, cut short by closing); nil once closed and nothing waits.
      def next_window(pause)
        @lock.synchronize do
          @sending = false
          if pause
            until_time = Continuous.now + pause
            while !@closed && (left = until_time - Continuous.now).positive?
              @changed.wait(@lock, left)
            end
          end
          @changed.wait(@lock) while @queue.empty? && !@closed
          return nil if @queue.empty? || (@closed && @streak.positive?)

          @sending = true
          @queue.first
        end
      end

      # Counts what became of window; returns the pause before the next
      # attempt (nil: none) and a line to say (nil: none).
      def settle(window, outcome)
        @lock.synchronize do
          if outcome.ok
            @queue.delete(window)
            @uploaded += 1
            @bytes += window.body.bytesize
            line = "uploads work again (#{@dropped} windows dropped so far)" if @streak.positive? && said(:working)
            @streak = 0
            return [nil, line]
          end

          @failures += 1
          @last_error = outcome.message
          @streak += 1
          line = "could not upload a profile: #{outcome.message}#{' (sending it again later)' if outcome.retry}" if said(:failing)
          if outcome.retry && !@closed
            [backoff, line]
          else
            @queue.delete(window)
            outcome.retry ? @dropped += 1 : @rejected += 1
            [nil, line]
          end
        end
      end

      # Whether a line of kind may be said now (at most one every QUIET
      # seconds; a recovery only after a failure was said).
      def said(kind)
        return false if kind == :working && !@failure_said
        return false if Continuous.now - @said[kind] < QUIET

        @said[kind] = Continuous.now
        @failure_said = kind == :failing
        true
      end

      # The pause after the streak's failures: doubling, capped, and
      # between half and all of that (jitter).
      def backoff
        length = [BACKOFF * (2**[@streak - 1, 16].min), MAX_BACKOFF].min
        length * (0.5 + (rand * 0.5))
      end

      def thread_cpu
        Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      end
    end
  end
end
