# frozen_string_literal: true

module Strobe
  class Middleware
    # The one thread per process that stops a middleware's profile once no
    # request has run for its idle_stop: seconds (Middleware#idle_check).
    # Strobe profiles the whole process, so at most one middleware's
    # profile runs at a time and one deadline is enough. The thread starts
    # when first needed (again in a forked child, which has no threads but
    # the forking one), is never profiled itself, and waits without a
    # timeout while nothing is due.
    module IdleStop
      @pid = nil
      @lock = Mutex.new # (a forked child's is unlocked: Ruby abandons the locks of threads it does not keep)
      @cond = ConditionVariable.new
      @due = nil # [middleware, monotonic deadline]

      class << self
        # Calls middleware.idle_check at the monotonic time at (or soon
        # after), replacing whatever was due.
        def arm(middleware, at)
          @lock.synchronize do
            start unless @pid == Process.pid
            @due = [middleware, at]
            @cond.signal
          end
        end

        private

        # With @lock held.
        def start
          @pid = Process.pid
          thread = Thread.new do
            Native.exclude_current_thread
            loop { due.idle_check }
          end
          thread.name = "strobe idle stop"
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
