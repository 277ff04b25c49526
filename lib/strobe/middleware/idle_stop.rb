# frozen_string_literal: true

module Strobe
  class Middleware
    # The one thread per process that stops a middleware's profile once no
    # request has run for its idle_stop: seconds (Middleware#idle_check).
    # Strobe profiles the whole process, so at most one middleware's
    # profile runs at a time and one deadline is enough. The thread starts
    # before a middleware's profile does (prepare; again in a forked child,
    # which has no threads but the forking one, and if something killed
    # it), is never profiled itself, and waits without a timeout while
    # nothing is due.
    module IdleStop
      @pid = nil
      @thread = nil
      @lock = Mutex.new # (a forked child's is unlocked: Ruby abandons the locks of threads it does not keep)
      @cond = ConditionVariable.new
      @due = nil # [middleware, monotonic deadline]

      class << self
        # Starts the thread if this process has none alive, and waits until
        # it has excluded itself from profiling: called before a profile
        # starts, so that not even its start is in one.
        def prepare
          @lock.synchronize { start unless running? }
        end

        # Calls middleware.idle_check at the monotonic time at (or soon
        # after), replacing whatever was due.
        def arm(middleware, at)
          @lock.synchronize do
            start unless running?
            @due = [middleware, at]
            @cond.signal
          end
        end

        private

        def running?
          @pid == Process.pid && @thread&.alive?
        end

        # With @lock held (the new thread waits for it to take its first
        # deadline, and Queue#pop lets it run meanwhile).
        def start
          @pid = Process.pid
          ready = Queue.new
          @thread = Thread.new do
            Native.exclude_current_thread
            ready << true
            loop do
              begin
                due.idle_check
              rescue StandardError
                nil # (idle_check reports its own; nothing may end this thread)
              end
            end
          end
          @thread.name = "strobe idle stop"
          ready.pop
        end

        # Waits for the deadline; returns its middleware.
        def due
          @lock.synchronize do
            loop do
              left = @due && @due[1] - Process.clock_gettime(Process::CLOCK_MONOTONIC)
              if left && left <= 0
                middleware = @due[0]
                @due = nil
                return middleware
              end
              @cond.wait(@lock, left)
            end
          end
        end
      end
    end
  end
end
