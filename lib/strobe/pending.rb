# frozen_string_literal: true

module Strobe
  # What the next result gets besides the samples: the settings start was
  # given for it (metadata, out:, format:, on_result:), kept until results
  # (or, with on_result, stop) takes them. Strobe and the StackProf drop-in
  # each keep one.
  class Pending
    def initialize
      @settings = {}
    end

    def [](key)
      @settings[key]
    end

    # Takes settings, then yields to start sampling (the block returns
    # whether it started); puts the previous ones back when it did not.
    # They are set first so that :object mode does not sample setting them.
    def start(settings)
      previous = @settings
      @settings = settings
      started = false
      begin
        started = yield
      ensure
        @settings = previous unless started
      end
      started
    end

    # The settings, forgotten here: results takes them.
    def take
      taken = @settings
      @settings = {}
      taken
    end
  end
end
