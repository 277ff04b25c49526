# frozen_string_literal: true

module Strobe
  # What the next result gets besides the samples: the metadata given to
  # start, and where results should write it (out:). Strobe and the
  # StackProf drop-in each keep one.
  class Pending
    attr_reader :metadata, :out

    # Takes metadata and out, then yields to start sampling (the block
    # returns whether it started); puts the previous ones back when it did
    # not. They are set first so that :object mode does not sample setting
    # them.
    def start(metadata, out)
      previous = [@metadata, @out]
      @metadata = metadata
      @out = out
      started = false
      begin
        started = yield
      ensure
        @metadata, @out = previous unless started
      end
      started
    end

    # [metadata ({} when none), out], forgetting both: results takes them.
    def take
      taken = [@metadata || {}, @out]
      @metadata = @out = nil
      taken
    end
  end
end
