# frozen_string_literal: true

module Strobe
  # What the next result gets besides the samples: the settings start was
  # given for it (metadata, out:, format:, on_result:), kept until results
  # (or, with on_result, stop) takes them. Strobe and the StackProf drop-in
  # each keep one.
  #
  # A forked child does not inherit them: the profile they belong to is
  # the parent's (its copy is dropped in the child, see sampler.c), and a
  # child's own profile must not go to the parent's out: file.
  class Pending
    def initialize
      @settings = {}
      @pid = Process.pid
    end

    def [](key)
      settings[key]
    end

    # Takes settings, then yields to start sampling (the block returns
    # whether it started); puts the previous ones back when it did not.
    # They are set first so that :object mode does not sample setting them.
    def start(settings)
      previous = self.settings
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
      taken = settings
      @settings = {}
      taken
    end

    private

    def settings
      unless @pid == Process.pid
        @pid = Process.pid
        @settings = {}
      end
      @settings
    end
  end
end
