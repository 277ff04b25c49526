# frozen_string_literal: true

require "stringio"
require_relative "../../strobe"
require_relative "errors"
require_relative "config"

module Strobe
  class Continuous
    # What the pull endpoint (PullServer) serves: a profile taken on
    # request, for the seconds asked, then the profiler stops again, so a
    # process that is not being scraped pays nothing. One at a time, as Go's
    # CPU profile endpoint; a request that comes while one is taken waits
    # its turn, in the order they came, for at most `wait` seconds (WAIT:
    # a scrape that comes as the previous one ends is served, one that
    # would wait longer than its scraper does is told so at once), then is
    # told so (Busy), as is one that comes while anything else profiles the
    # process (a push session, the middleware).
    class PullProfiler
      TIME_MODES = %i[cpu wall].freeze
      DEFAULT_SECONDS = 30
      WAIT = 5

      attr_reader :mode, :interval

      def initialize(mode: :cpu, interval: nil, wait: WAIT)
        @mode = Options.mode_in(mode, Config::MODES, "to serve pulls")
        @interval = Config.interval_for(@mode, interval)
        unless wait.is_a?(Numeric) && wait >= 0 && wait.finite?
          raise ArgumentError, "wait: must be a number of seconds, got #{wait.inspect}"
        end

        @wait = wait
        @lock = Mutex.new
        @turn = ConditionVariable.new
        @waiting = [] # the requests waiting, first come first
        @taking = false
      end

      # How many requests wait their turn.
      def waiting
        @lock.synchronize { @waiting.size }
      end

      # /debug/pprof/profile: the gzipped pprof of the next `seconds` of
      # the process's time samples.
      def profile(seconds:)
        unless TIME_MODES.include?(@mode)
          raise Unavailable, "this listener samples allocations (mode #{@mode.inspect}): ask /debug/pprof/allocs"
        end

        take(seconds)
      end

      # /debug/pprof/allocs: the gzipped pprof of the allocations sampled
      # over the next `seconds` (a delta profile, as Go's with ?seconds=;
      # without, over DEFAULT_SECONDS: Strobe keeps no allocation counts
      # since the process began, as Go's runtime does).
      def allocs(seconds:)
        seconds ||= DEFAULT_SECONDS
        unless @mode == :object
          raise Unavailable, "this listener samples #{@mode} time, not allocations: " \
                             "Strobe.listen(..., mode: :object) serves them"
        end

        take(seconds)
      end

      private

      def take(seconds)
        unless my_turn
          raise Busy, "a profile is being taken for another request (one at a time; waited #{@wait} s)"
        end

        begin
          started = Strobe.start_own(nil, mode: @mode, interval: @interval, raw: true)
          unless started
            raise Busy, "Strobe is already profiling this process (continuous push, the middleware or Strobe.start), " \
                        "or a stopped profile waits for Strobe.results"
          end

          round = Native.round
          sleep seconds
          raise Busy, "the profile was stopped by someone else" unless Native.stop_round(round)

          result = Strobe.results
          out = StringIO.new(+"".b)
          Strobe.save(result, out, format: :pprof)
          out.string
        ensure
          Strobe.results if round && Native.stop_round(round) # cut short: its samples go nowhere
          @lock.synchronize do
            @taking = false
            @turn.broadcast
          end
        end
      end

      # Waits until no profile is taken and every request that came before
      # has had its turn, for at most @wait seconds; true when the turn is
      # this request's (then @taking), false when the wait ran out.
      def my_turn
        ticket = Object.new
        deadline = Continuous.now + @wait
        @lock.synchronize do
          @waiting << ticket
          begin
            while @taking || !@waiting.first.equal?(ticket)
              left = deadline - Continuous.now
              return false unless left.positive?

              @turn.wait(@lock, left)
            end
            @taking = true
          ensure
            @waiting.delete(ticket) # taken, given up, or killed: the next may go
            @turn.broadcast
          end
        end
      end
    end
  end
end
