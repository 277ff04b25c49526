# frozen_string_literal: true

require "rbconfig"
require_relative "strobe/version"
require_relative "strobe/options"
require_relative "strobe/profile_file"
require_relative "strobe/pending"
require_relative "strobe/ruby_bugs"

# The C extension. STROBE_LIB lets `rake test:asan` load a sanitizer build.
# A checkout keeps one build per Ruby ABI (lib/strobe/3.4.0/strobe.so,
# `rake compile`), so several Rubies can share it; an installed gem has its
# one build in lib/strobe/.
if ENV["STROBE_LIB"]
  require File.expand_path("strobe/strobe", ENV["STROBE_LIB"])
elsif File.exist?(File.expand_path("strobe/#{RbConfig::CONFIG['ruby_version']}/strobe.#{RbConfig::CONFIG['DLEXT']}",
                                   __dir__))
  require_relative "strobe/#{RbConfig::CONFIG['ruby_version']}/strobe"
else
  require_relative "strobe/strobe"
end

require_relative "strobe/stacks"

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
  autoload :Middleware, File.expand_path("strobe/middleware", __dir__)
  autoload :Toggle, File.expand_path("strobe/toggle", __dir__)
  @pending = Pending.new
  # How often a start takes the profiler back when others keep starting
  # in between (see taking_back) before it is refused.
  TAKE_BACK_TRIES = 3

  class << self
    # Strobe.run(**options) { ... } profiles the block and returns the
    # result Hash (or writes it to out:); Strobe.stop stops profiling (false
    # when not running); Strobe.running?. These three are defined in C
    # (ext/strobe/strobe.c), so that no Ruby code of Strobe's runs inside
    # the profiled window.

    # Starts profiling. Returns false when already running. Raises
    # ArgumentError for a bad option, leaving the profiler stopped. A profile
    # lent out (a middleware's between requests, see lend) is given back
    # first: its holder saves it and steps aside.
    def start(**opts)
      start_round(opts, nil)
    end

    # Strobe.start for one of Strobe's own profilers (the middleware, the
    # continuous profiler, the pull endpoint, the signal toggle), which
    # takes the results of what it starts: false, adding nothing, while a
    # profile someone else stopped waits for its results (Strobe.results).
    # A start adds to such a profile (rounds merge until results), so the
    # caller would take that profile's samples as its own, and its owner
    # would find nothing. mine: the round (Native.round) of the caller's
    # own stopped profile, which it may add to, or nil.
    def start_own(mine, **opts) # :nodoc:
      start_round(opts, mine || false)
    end

    # Strobe.start, adding only to the stopped profile adds_to allows (see
    # Native.start): nil, any; false, none; a round, that one.
    private def start_round(opts, adds_to)
      return false if running? && !lent?

      options = Options.new(opts)
      taking_back do |round|
        # Metadata of several start/stop rounds merges; the last out:, format:
        # and on_result: given win; the working directory is the first round's.
        settings = { metadata: (@pending[:metadata] || {}).merge(options.metadata),
                     out: options.out || @pending[:out],
                     format: opts.key?(:format) ? options.format : @pending[:format] || options.format,
                     on_result: options.on_result || @pending[:on_result],
                     cwd: @pending[:cwd] || working_directory }
        @pending.start(settings) do
          if options.trace?
            check_trace_round(options)
            Native.trace_start(options.clock == :cpu, options.threads_list, *options.exclusions, round, adds_to)
          else
            RubyBugs.tell(options.mode)
            Native.start(options.mode, options.interval, options.raw, options.aggregate, options.ignore_gc,
                         options.threads_list, options.native_timer, options.native, round, adds_to)
          end
        end
      end
    end

    # Lends the profiler to holder while the profile of round (Native.round,
    # running or stopped with its results not yet taken) is its own: a start
    # by anyone calls holder.give_way first, which saves that profile and
    # stops it unless the holder is using it (Strobe::Middleware: while no
    # request it profiles is in flight). Holder's own start adds to it.
    def lend(holder, round) # :nodoc:
      @lent = [holder, round, Process.pid]
    end

    # Whether the profile is lent (see lend); false in a forked child.
    def lent? # :nodoc:
      holder, round, pid = @lent
      !holder.nil? && pid == Process.pid && round == Native.round
    end

    # Has the holder of a lent profile give it back (holder.give_way);
    # returns the round (Native.round) whose profile that settled, for
    # Native.start, or nil when the profiler is not free: running, or the
    # holder keeps its stopped profile (a request of its in flight). The
    # round is read first: give_way saves in this thread after it lets go
    # of the holder's lock, and a whole round of the holder's can begin, end
    # and stop meanwhile; Native.start then refuses, the round being past.
    def take_back # :nodoc:
      round = Native.round
      holder, = @lent
      return nil if lent? && holder.give_way == false

      running? ? nil : round
    end

    # Yields the round at which the profiler was taken back (take_back), for
    # the block to start at it (Native.start refuses once another start came
    # since). Ruby may switch threads between the two: a middleware's whole
    # round can begin, end and stop meanwhile, its result not taken; the
    # profiler is then taken back again (its holder saves it), at most
    # TAKE_BACK_TRIES times. Returns what the block returns, or false.
    # (A loop, not a block: once the block has started an :object profile,
    # a return through a block's frame allocates, a sample of Strobe's.)
    def taking_back # :nodoc:
      tries = 0
      while tries < TAKE_BACK_TRIES
        round = take_back
        return false unless round

        started = yield(round)
        return started if started || Native.round == round

        tries += 1
      end
      false
    end

    # A trace's rounds (start/stop until results) share one clock, one
    # exclude: and one threads: list; a round asking for others is refused.
    def check_trace_round(options)
      settings = [options.clock, options.exclusions, options.threads_list]
      if Native.trace_active? && @trace_settings && @trace_settings != settings
        raise ArgumentError, "clock:, exclude: and threads: must be those of the trace in progress " \
                             "(#{@trace_settings[0].inspect} ...): take its results first"
      end
      @trace_settings = settings
    end

    # The result of everything sampled since the last call, or nil while
    # running or when nothing was started. With out (a path or an IO), or the
    # out: given to start, writes the profile there and returns the path/IO.
    def results(out = nil)
      result, settings = collect
      return nil unless result

      target = out || settings[:out]
      return result unless target

      ProfileFile.write(result, target, format: settings[:format] || :json)
      target
    end

    # The result of everything sampled so far, while profiling goes on (it
    # forgets nothing: a later snapshot or results includes it all again);
    # nil when nothing was started. For a look at a long-running program
    # (what `strobe serve` shows). With reset: true the profile starts
    # afresh at that instant instead: the next snapshot or results holds
    # only what comes after, and no sample falls between the two (how the
    # middleware saves every N requests while requests go on).
    def snapshot(reset: false)
      raise ArgumentError, "reset must be true or false, got #{reset.inspect}" unless [true, false].include?(reset)

      result = Native.snapshot(reset)
      return nil unless result

      result[:metadata] = (@pending[:metadata] || {}).dup
      result[:cwd] = @pending[:cwd] if @pending[:cwd]
      result
    end

    # Strobe.sample (defined in C) takes one sample of the current stack in
    # any mode; it returns false when not running.

    # Marks the block's span of time on the calling thread's timeline: a
    # marker named name, with data (Symbol keys; Strings, numbers, true,
    # false or nil, others as their to_s), in result[:markers]. Returns what
    # the block returns.
    # Without a block, marks an instant (and returns nil). Kept only while
    # the thread is being sampled; otherwise the block just runs.
    def mark(name, **data, &block)
      Markers.mark(:user, name, data, &block)
    end

    # Reads a profile written by Strobe (JSON, or gzipped JSON) back into the
    # result Hash. Raises Strobe::ProfileError for a file that is not one.
    def load(path, marshal: false)
      ProfileFile.read(path, marshal: marshal)
    end

    # Writes a result Hash to path (or IO): Strobe's compact JSON (gzipped
    # when the path ends in .gz), or another of Options::FORMATS.
    def save(result, target, format: :json)
      ProfileFile.write(result, target, format: format)
    end

    # Each `signal` (a name such as :USR2) starts or stops profiling; see
    # Strobe::Toggle (lib/strobe/toggle.rb) for the options. Replaces an
    # earlier toggle.
    def toggle_on(signal, **options)
      toggle = Toggle.new(signal, **options)
      toggle_off
      @toggle = toggle.install
      true
    end

    # Removes the toggle (profiling that is running goes on); false when
    # there was none.
    def toggle_off
      return false unless @toggle

      @toggle.uninstall
      @toggle = nil
      true
    end

    private

    # Called by Strobe.stop (C) once sampling has stopped: an on_result:
    # proc gets the result Hash, on a thread of its own (after out:, if
    # given too, was written).
    def stopped
      return unless @pending[:on_result]

      result, settings = collect
      return unless result

      ProfileFile.write(result, settings[:out], format: settings[:format] || :json) if settings[:out]
      Thread.new { settings[:on_result].call(result) }
    end

    # [the result with its metadata, the settings start was given], taking
    # both; nil while running or when nothing was profiled.
    def collect
      return nil if running?

      result = Native.results
      return nil unless result

      settings = @pending.take
      result[:metadata] = settings[:metadata] || {}
      result[:cwd] = settings[:cwd] if settings[:cwd]
      [result, settings]
    end

    # The working directory, against which the relative paths of Ruby's
    # frames (`ruby app.rb` names app.rb's top frame "app.rb") are resolved
    # (result[:cwd]); nil when it is gone.
    def working_directory
      Dir.pwd
    rescue SystemCallError
      nil
    end
  end
end
