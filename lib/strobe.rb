# frozen_string_literal: true

require_relative "strobe/version"
require_relative "strobe/options"
require_relative "strobe/profile_file"
require_relative "strobe/pending"

# The C extension. STROBE_LIB lets `rake test:asan` load a sanitizer build.
if ENV["STROBE_LIB"]
  require File.expand_path("strobe/strobe", ENV["STROBE_LIB"])
else
  require_relative "strobe/strobe"
end

# Strobe: a sampling call-stack profiler.
#
#   result = Strobe.run(mode: :cpu, interval: 1000) { work }
#
# The result is a Hash with the keys and meaning of stackprof 0.2.27's result,
# plus extensions under new keys (see README, "The result").
module Strobe
  # Reports are loaded when first used, so profiling alone loads no more.
  autoload :Report, File.expand_path("strobe/report", __dir__)
  autoload :Flamegraph, File.expand_path("strobe/flamegraph", __dir__)
  autoload :Merge, File.expand_path("strobe/merge", __dir__)
  @pending = Pending.new

  class << self
    # Strobe.run(**options) { ... } profiles the block and returns the
    # result Hash (or writes it to out:); Strobe.stop stops profiling (false
    # when not running); Strobe.running?. These three are defined in C
    # (ext/strobe/strobe.c), so that no Ruby code of Strobe's runs inside
    # the profiled window.

    # Starts profiling. Returns false when already running. Raises
    # ArgumentError for a bad option, leaving the profiler stopped.
    def start(**opts)
      return false if running?

      options = Options.new(opts)
      # Metadata of several start/stop rounds merges; the last out: wins.
      @pending.start((@pending.metadata || {}).merge(options.metadata), options.out || @pending.out) do
        Native.start(options.mode, options.interval, options.raw, options.aggregate, options.ignore_gc,
                     options.threads_list, options.timer)
      end
    end

    # The result of everything sampled since the last call, or nil while
    # running or when nothing was started. With out (a path or an IO), or the
    # out: given to start, writes the profile there and returns the path/IO.
    def results(out = nil)
      return nil if running?

      result = Native.results
      return nil unless result

      result[:metadata], pending_out = @pending.take
      target = out || pending_out
      return result unless target

      ProfileFile.write(result, target)
      target
    end

    # Strobe.sample (defined in C) takes one sample of the current stack in
    # any mode; it returns false when not running.

    # Reads a profile written by Strobe (JSON, or gzipped JSON) back into the
    # result Hash. Raises Strobe::ProfileError for a file that is not one.
    def load(path, marshal: false)
      ProfileFile.read(path, marshal: marshal)
    end

    # Writes a result Hash to path (or IO) in Strobe's compact JSON format.
    def save(result, target)
      ProfileFile.write(result, target)
    end
  end
end
