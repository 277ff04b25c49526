# frozen_string_literal: true

module Strobe
  # Raised for misuse of the profiler itself (e.g. run while running).
  class Error < StandardError; end

  # Validates the options of Strobe.start/run. Every problem raises
  # ArgumentError naming the option, before anything is started.
  class Options
    MODES = %i[wall cpu object custom trace].freeze
    KEYS = %i[mode interval raw aggregate ignore_gc metadata out format on_result threads timer scheduler clock
              exclude native].freeze
    # mode: :trace's clocks: elapsed time, or each thread's own CPU time.
    CLOCKS = %i[wall cpu].freeze
    # Options for sampling only, refused with mode: :trace.
    SAMPLING_ONLY = %i[interval raw aggregate ignore_gc timer scheduler native].freeze
    # File formats results can write (out:, format:): Strobe's own JSON,
    # SamplingProf's text, pprof's profile.proto (gzipped), the Firefox
    # Profiler's JSON and speedscope's JSON.
    FORMATS = %i[json sampling_prof pprof firefox speedscope].freeze
    # Formats built from the raw samples: raw: defaults to true with them.
    RAW_FORMATS = %i[sampling_prof pprof firefox speedscope].freeze
    # :threads, Strobe's timer thread signalling each thread by its own
    # clock; :process, one process-wide timer (the thread it lands on).
    TIMERS = %i[threads process].freeze
    # :signals, samples taken by timer signals (timer: says which); :thread,
    # no signals at all: Strobe's thread asks for samples at safe points.
    SCHEDULERS = %i[signals thread].freeze
    DEFAULT_INTERVAL = { wall: 1000, cpu: 1000, object: 1, custom: nil, trace: nil }.freeze
    # Time modes: microseconds in [MIN_TIME_INTERVAL, MAX_TIME_INTERVAL].
    MIN_TIME_INTERVAL = 1
    MAX_TIME_INTERVAL = 1_000_000
    MAX_OBJECT_INTERVAL = 2**31 - 1

    attr_reader :mode, :interval, :raw, :aggregate, :ignore_gc, :metadata, :out, :format, :on_result, :threads, :timer,
                :scheduler, :clock, :exclude, :native

    # Raises ArgumentError naming every key of opts that is not in keys
    # (and the known ones).
    def self.check_known(opts, keys)
      unknown = opts.keys - keys
      return if unknown.empty?

      raise ArgumentError, "unknown option#{'s' if unknown.size > 1}: #{unknown.map(&:inspect).join(', ')} " \
                           "(known: #{keys.join(', ')})"
    end

    def initialize(opts)
      Options.check_known(opts, KEYS)

      @mode = parse_mode(opts.fetch(:mode, :wall))
      check_trace_options(opts)
      @interval = parse_interval(opts[:interval])
      @format = parse_format(opts.fetch(:format, :json))
      @raw = parse_flag(:raw, opts[:raw].nil? ? RAW_FORMATS.include?(@format) : opts[:raw])
      if RAW_FORMATS.include?(@format) && !@raw
        raise ArgumentError, "format #{@format.inspect} needs raw: true (it is built from the raw samples)"
      end
      @aggregate = parse_flag(:aggregate, opts.fetch(:aggregate, true))
      @ignore_gc = parse_flag(:ignore_gc, opts.fetch(:ignore_gc, false))
      @metadata = parse_metadata(opts[:metadata])
      @out = parse_out(opts[:out])
      @on_result = opts[:on_result]
      unless @on_result.nil? || @on_result.respond_to?(:call)
        raise ArgumentError, "on_result must be a proc (given the result Hash), got #{@on_result.inspect}"
      end
      @threads = parse_threads(opts.fetch(:threads, :all))
      @timer = parse_timer(opts.fetch(:timer, :threads))
      @scheduler = opts.fetch(:scheduler, :signals)
      unless SCHEDULERS.include?(@scheduler)
        raise ArgumentError, "scheduler must be #{SCHEDULERS.map(&:inspect).join(' or ')}, got #{@scheduler.inspect}"
      end
      if @scheduler == :thread && opts.key?(:timer)
        raise ArgumentError, "scheduler: :thread uses no timer signal: leave out timer: #{@timer.inspect}"
      end
      @native = parse_native(opts.fetch(:native, false))
    end

    # The values of a flag in the environment (STROBE_RAW, STROBE_IGNORE_GC,
    # ...); unset is false.
    TRUE_VALUES = %w[1 true yes on].freeze
    FALSE_VALUES = ["", "0", "false", "no", "off"].freeze

    # value, the setting of the environment variable name, as true or false;
    # ArgumentError naming it for anything else.
    def self.env_flag(name, value)
      normalized = value.to_s.strip.downcase
      return true if TRUE_VALUES.include?(normalized)
      return false if FALSE_VALUES.include?(normalized)

      raise ArgumentError, "#{name} must be 1 or 0 (or true/false), got #{value.inspect}"
    end

    def trace?
      @mode == :trace
    end

    # What Native.start is told: :threads, :process or :safepoints.
    def native_timer
      @scheduler == :thread ? :safepoints : @timer
    end

    # nil for every thread (:all), or the Array of Threads to profile.
    def threads_list
      @threads == :all ? nil : @threads
    end

    # exclude: for the tracer (C): [exact names, path prefixes, Regexps].
    def exclusions
      [@exclude.grep(String), @exclude.grep(PathPrefix).map(&:path), @exclude.grep(Regexp)]
    end

    # A String of exclude: that names files: it starts with "/" or "."
    # (expanded; it matches whole directory or file names).
    PathPrefix = Struct.new(:path)

    private

    # clock: and exclude: go with mode: :trace, the sampling options not.
    def check_trace_options(opts)
      if trace?
        given = SAMPLING_ONLY.select { |key| opts.key?(key) && !opts[key].nil? && opts[key] != false }
        unless given.empty?
          raise ArgumentError, "mode :trace takes no #{given.map(&:inspect).join(', ')} (it records every call, no samples)"
        end
        format = opts[:format].is_a?(String) ? opts[:format].to_sym : opts[:format]
        if RAW_FORMATS.include?(format)
          raise ArgumentError, "format #{format.inspect} is built from samples: mode :trace writes :json"
        end
      else
        given = %i[clock exclude].select { |key| opts.key?(key) }
        raise ArgumentError, "#{given.map(&:inspect).join(' and ')} go with mode: :trace" unless given.empty?
      end
      @clock = opts.fetch(:clock, :wall)
      raise ArgumentError, "clock must be :wall or :cpu, got #{@clock.inspect}" unless CLOCKS.include?(@clock)

      @exclude = Array(opts.fetch(:exclude, [])).map do |pattern|
        case pattern
        when Regexp then pattern
        when String
          raise ArgumentError, "exclude: an empty String names nothing" if pattern.empty?

          pattern.start_with?("/", ".") ? PathPrefix.new(File.expand_path(pattern)) : pattern
        else raise ArgumentError, "exclude must hold method names (Strings), Regexps or paths, got #{pattern.inspect}"
        end
      end
    end

    def parse_mode(mode)
      Options.mode_in(mode, MODES)
    end

    # mode (a Symbol or String) as a Symbol when it is one of allowed;
    # ArgumentError otherwise, saying what the allowed ones are for.
    def self.mode_in(mode, allowed, purpose = nil)
      mode = mode.to_sym if mode.is_a?(String)
      return mode if allowed.include?(mode)

      known = allowed.map(&:inspect).join(", ")
      raise ArgumentError, "unknown mode: #{mode.inspect} (known: #{known})" unless purpose

      raise ArgumentError, "mode must be #{known} #{purpose}, got #{mode.inspect}"
    end

    def parse_interval(value)
      return DEFAULT_INTERVAL.fetch(@mode) if value.nil?
      return nil if @mode == :custom

      unless value.is_a?(Integer)
        raise ArgumentError, "interval must be an Integer, got #{value.inspect}"
      end

      if @mode == :object
        return value if value.between?(1, MAX_OBJECT_INTERVAL)

        raise ArgumentError, "interval for :object mode is a number of allocations from 1 to #{MAX_OBJECT_INTERVAL}, got #{value}"
      end
      return value if value.between?(MIN_TIME_INTERVAL, MAX_TIME_INTERVAL)

      raise ArgumentError, "interval is a number of microseconds from #{MIN_TIME_INTERVAL} to #{MAX_TIME_INTERVAL}, got #{value}"
    end

    # true or false (nil: false); anything else is a mistake worth naming.
    def parse_flag(name, value)
      return value == true if [true, false, nil].include?(value)

      raise ArgumentError, "#{name} must be true or false, got #{value.inspect}"
    end

    # native: true walks the native stack in the signal handler: time modes
    # with signals only, and only where Strobe was built with libunwind.
    def parse_native(value)
      return false unless parse_flag(:native, value)

      unless %i[wall cpu].include?(@mode) && @scheduler == :signals
        raise ArgumentError, "native: true needs mode :wall or :cpu with timer signals " \
                             "(native stacks are taken in the signal handler), got mode #{@mode.inspect}" \
                             "#{", scheduler #{@scheduler.inspect}" if @scheduler != :signals}"
      end
      # (The command line checks options without loading the extension; the
      # profiled program checks this part.)
      if defined?(Native::NATIVE_FRAMES) && !Native::NATIVE_FRAMES
        raise ArgumentError, "native: true needs libunwind, and Strobe was built without it: " \
                             "install libunwind-dev (Debian, Ubuntu) or libunwind-devel, then reinstall strobe"
      end
      true
    end

    def parse_threads(value)
      return :all if value == :all

      list = value.is_a?(Thread) ? [value] : value
      if list.is_a?(Array) && !list.empty? && list.all?(Thread)
        return list.uniq
      end

      raise ArgumentError, "threads must be :all or an Array of Thread objects, got #{value.inspect}"
    end

    def parse_format(value)
      value = value.to_sym if value.is_a?(String)
      return value if FORMATS.include?(value)

      raise ArgumentError, "format must be #{FORMATS.map(&:inspect).join(' or ')}, got #{value.inspect}"
    end

    def parse_timer(value)
      return value if TIMERS.include?(value)

      raise ArgumentError, "timer must be #{TIMERS.map(&:inspect).join(' or ')}, got #{value.inspect}"
    end

    def parse_metadata(value)
      return {} if value.nil?
      return value if value.is_a?(Hash)

      raise ArgumentError, "metadata must be a Hash, got #{value.class}"
    end

    # A path must be writable now, so that a long run does not end in a lost
    # profile. The file itself is only written (atomically) by results.
    def parse_out(out)
      return nil if out.nil? || out == false
      return out if out.respond_to?(:write)

      unless out.is_a?(String) || out.respond_to?(:to_path)
        raise ArgumentError, "out must be a path or an IO, got #{out.class}"
      end

      path = out.respond_to?(:to_path) ? out.to_path : out
      dir = File.dirname(File.expand_path(path))
      unless File.directory?(dir) && File.writable?(dir)
        raise ArgumentError, "out path is not writable: #{path} (directory #{dir} #{File.directory?(dir) ? 'is not writable' : 'does not exist'})"
      end
      if File.directory?(path)
        raise ArgumentError, "out path is a directory: #{path}"
      end

      path
    end
  end
end
