# frozen_string_literal: true

module Strobe
  # The errors a continuous profiler raises to say why it gives no profile
  # now; Strobe::Continuous::PullServer answers each with its own status.
  # (Strobe::Continuous is a class: opened here without a superclass.)
  class Continuous
    # Profiling cannot run now (another profile is being taken, say): the
    # pull server answers 500 with the message, as Go's net/http/pprof does
    # when it cannot enable CPU profiling.
    class Busy < StandardError; end

    # What was asked for is not collected in this process (allocations,
    # say): the pull server answers 404 with the message.
    class Unavailable < StandardError; end
  end
end
