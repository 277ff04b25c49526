# frozen_string_literal: true

# Strobe as a drop-in replacement for stackprof 0.2.27:
#
#   require "strobe/stackprof"   # instead of require "stackprof"
#
# defines StackProf with stackprof's API (run, start, stop, results,
# running?, sample, use_postponed_job!), its options, defaults, return
# values and errors, and its result Hash; StackProf::Report and
# StackProf::Middleware are loaded on first use. Profiling is done by
# Strobe. Once it is loaded, `require "stackprof"` (a library's own) loads
# it too (load_path/, first on $LOAD_PATH); the real gem loaded before it
# is refused with a LoadError. Differences from stackprof, all deliberate:
#
# - An option stackprof does not know raises ArgumentError naming it
#   (stackprof ignores it); the known options' own errors come first.
# - StackProf::Report.from_file loads a Marshal dump only when asked
#   (from_file(path, marshal: true)), since Marshal data can run code.
#   results(path) still writes Marshal dumps, as stackprof does, so the
#   real stackprof reads them.
# - :cpu mode samples every thread that uses CPU, each by its own CPU clock
#   (stackprof's process-wide timer lands on whichever thread runs: the
#   same threads, at the kernel's tick rate). :wall mode samples the thread
#   that called start, as stackprof does.
# - use_postponed_job! is accepted and has nothing left to do: stackprof
#   needs it (and calls it itself under YJIT before Ruby 3.3) so that frames
#   are read at safe points, where JIT code has left them consistent; Strobe
#   does that by itself whenever YJIT needs it, for the threads that may be
#   running JIT code (see docs/ARCHITECTURE.md).
if defined?(StackProf) && !defined?(StackProf::STROBE)
  raise LoadError, "strobe/stackprof: the stackprof gem is already loaded (StackProf is defined); " \
                   "remove `require \"stackprof\"` (or `require: false` it in the Gemfile) to use Strobe's StackProf"
end

require_relative "../strobe"

# stackprof's API, implemented by Strobe.
module StackProf
  VERSION = "0.2.27"
  # Marks this StackProf as Strobe's (the real gem does not define it).
  STROBE = Strobe::VERSION

  autoload :Report, File.expand_path("stackprof/report", __dir__)
  autoload :Middleware, File.expand_path("stackprof/middleware", __dir__)

  # The options of StackProf.start, read as stackprof reads them.
  class Options
    KEYS = %i[mode interval raw aggregate ignore_gc metadata out].freeze
    MODES = %i[wall cpu object custom].freeze
    DEFAULT_INTERVAL = { wall: 1000, cpu: 1000, object: 1 }.freeze

    attr_reader :mode, :interval, :raw, :aggregate, :ignore_gc, :metadata, :out

    def initialize(opts)
      metadata = opts[:metadata]
      raise ArgumentError, "metadata should be a hash" if metadata && !metadata.is_a?(Hash)

      @metadata = metadata || {}
      @mode = opts[:mode] || :wall
      interval = opts[:interval]
      unless interval.nil?
        interval = self.class.integer(interval)
        unless interval.between?(1, 999_999)
          raise ArgumentError, "interval is a number of microseconds between 1 and 1 million"
        end
      end
      raise ArgumentError, "unknown profiler mode" unless MODES.include?(@mode)

      unknown = opts.keys - KEYS
      raise ArgumentError, "unknown option#{'s' if unknown.size > 1}: #{unknown.map(&:inspect).join(', ')}" unless unknown.empty?

      @interval = @mode == :custom ? nil : interval || DEFAULT_INTERVAL.fetch(@mode)
      @raw = opts[:raw] ? true : false
      @aggregate = opts.fetch(:aggregate, true) != false
      @ignore_gc = opts[:ignore_gc] ? true : false
      @out = opts[:out] || nil
    end

    # value as an Integer, converted as stackprof's C code converts it.
    def self.integer(value)
      return value if value.is_a?(Integer)
      return value.to_int if value.respond_to?(:to_int)

      raise TypeError, "no implicit conversion of #{value.class} into Integer"
    end

    # The threads Strobe samples: stackprof's wall timer is forwarded to the
    # thread that started it; its CPU timer, allocation hook and sample
    # calls are not tied to a thread.
    def threads
      @mode == :wall ? [Thread.current] : nil
    end
  end

  # The keys of stackprof's result Hash, in its order; Strobe's extensions
  # (threads, per-sample threads and states) are left out.
  RESULT_KEYS = %i[version mode interval samples gc_samples missed_samples metadata frames
                   raw raw_lines raw_sample_timestamps raw_timestamp_deltas].freeze

  @pending = Strobe::Pending.new

  class << self
    # Starts profiling; false when already running (a middleware's profile
    # between requests is given back first, as for Strobe.start).
    def start(opts = {})
      return false if running? && !Strobe.lent?

      options = Options.new(opts)
      Strobe.taking_back do |round|
        @pending.start(metadata: options.metadata, out: options.out) do
          Strobe::Native.start(options.mode, options.interval, options.raw, options.aggregate, options.ignore_gc,
                               options.threads, :threads, false, round, nil)
        end
      end
    end

    # The result Hash of everything sampled since the last results, or nil
    # while running or when nothing was started. With out (or the out: of
    # start), the result is written there as a Marshal dump, stackprof's
    # format, and the File or IO written is returned instead.
    def results(out = nil)
      return nil if running?

      native = Strobe::Native.results
      return nil unless native

      settings = @pending.take
      native[:metadata] = settings[:metadata] || {}
      result = Strobe.expand(native).slice(*RESULT_KEYS)
      target = out || settings[:out]
      target ? dump(result, target) : result
    end

    # Accepted for stackprof's API; see the comment at the top of this file.
    def use_postponed_job!
      nil
    end

    private

    # Writes result to target as stackprof does (Marshal), and returns the
    # IO, or for a path a File of it (closed; the path if it cannot be
    # opened again). A path is written by AtomicFile: owner-only, never
    # through another user's FIFO or symlink.
    def dump(result, target)
      if target.respond_to?(:to_io)
        file = target.to_io
        file.write(Marshal.dump(result))
        file.flush
        return file
      end

      path = Strobe::AtomicFile.write(target) { |io| io.write(Marshal.dump(result)) }
      begin
        File.new(path, File::RDONLY | File::NONBLOCK | Strobe::AtomicFile::NOFOLLOW).tap(&:close)
      rescue SystemCallError
        path
      end
    end

    # Loading the real stackprof after this file would put its methods on
    # this module; stop it at its first method instead, with ours kept.
    def singleton_method_added(name)
      super
      return unless @sealed && API.include?(name) && !@restoring

      @restoring = true
      define_singleton_method(name, API[name])
      @restoring = false
      raise LoadError, "the stackprof gem was loaded after strobe/stackprof: " \
                       "load one or the other (StackProf is already Strobe's)"
    end
  end

  # StackProf.run(options) { ... } (starts, or not when already running,
  # yields, stops, returns results), StackProf.stop (false when not
  # running), StackProf.running? and StackProf.sample (a sample of the
  # calling thread's stack now; false when not running): C methods, as in
  # stackprof, so that samples end in a frame StackProf.sample and no Ruby
  # wrapper runs inside the profiled window.
  Strobe::Native.define_stackprof(self)

  API = %i[start stop running? run results sample use_postponed_job!].to_h { |name| [name, method(name).unbind] }.freeze
  @sealed = true

  # From here on `require "stackprof"` (and "stackprof/report",
  # "stackprof/middleware") loads this drop-in, not the gem: a library that
  # requires stackprof itself then runs on Strobe. The directory goes first
  # on $LOAD_PATH, ahead of every gem's (Bundler's included).
  STROBE_LOAD_PATH = File.expand_path("stackprof/load_path", __dir__)
  $LOAD_PATH.unshift(STROBE_LOAD_PATH) unless $LOAD_PATH.include?(STROBE_LOAD_PATH)
end
