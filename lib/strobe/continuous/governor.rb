# frozen_string_literal: true

module Strobe
  class Continuous
    # Holds Strobe's cost near a share of one CPU (overhead_target:) by
    # choosing each window's sampling interval from the last window's
    # measured cost: what it costs scales with how often it samples, so the
    # interval that meets the target is the current one times cost/target.
    # It aims a little under the target (AIM), moves only when the cost is
    # off by more than SLACK either way (windows differ), at most
    # FASTER/SLOWER times per window, and never samples faster than the
    # interval the profile was started with, nor slower than `slowest`.
    class Governor
      AIM = 0.8
      SLACK = 0.25
      SLOWER = 4
      FASTER = 2

      attr_reader :target

      # target: a fraction of one CPU (nil: no governing); fastest: the
      # interval asked for; slowest: the longest interval allowed.
      def initialize(target, fastest, slowest)
        @target = target
        @fastest = fastest
        @slowest = [slowest, fastest].max
      end

      # The interval for the next window, given the current one and what
      # the last window cost: cost seconds of CPU over wall seconds.
      def next_interval(current, cost, wall)
        return current unless @target && wall.positive? && cost >= 0

        share = cost / wall
        return current if share.between?(@target * AIM * (1 - SLACK), @target * (1 + SLACK)) ||
                          (share < @target && current <= @fastest)

        wanted = (current * share / (@target * AIM)).round
        wanted.clamp([current / FASTER, @fastest].max, [current * SLOWER, @slowest].min)
      end
    end
  end
end
