# frozen_string_literal: true

# Profiles the whole program that loads this file, e.g.
#
#   RUBYOPT="-r/path/to/strobe/lib/strobe/autorun.rb" ruby app.rb
#
# (`strobe run` sets this up). Settings come from the environment:
#
#   STROBE_MODE      wall (default), cpu, object or custom
#   STROBE_INTERVAL  sampling interval (microseconds; allocations in object mode)
#   STROBE_RAW       1/true to keep raw samples (0/false/empty: not)
#   STROBE_IGNORE_GC 1/true to leave GC out of the samples
#   STROBE_NATIVE    1/true to record native (C) frames too (wall, cpu)
#   STROBE_FORMAT    json (default), pprof, firefox, speedscope or
#                    sampling_prof (the last four keep raw samples unless
#                    STROBE_RAW=0, which they refuse)
#   STROBE_OUT       where the profile is written (default strobe-profile.json)
#   STROBE_OUT_DIR   instead, a directory where each Ruby process writes its
#                    own profile, named PID.json, with the command line in
#                    its metadata (what `strobe run` sets)
#   STROBE_SIGNAL    a signal name (USR2, say): instead of profiling from the
#                    start, each such signal starts or stops profiling, and
#                    each stop writes a profile (STROBE_OUT is then a
#                    directory, default ".", or a file name numbered from the
#                    second stop on; see Strobe::Toggle)
#   STROBE_CONTINUOUS_URL, STROBE_PPROF_LISTEN: continuous profiling
#                    instead, pushed to Pyroscope or served for Alloy and
#                    Parca to pull (see Strobe::Continuous::FromEnv)
#   STROBE_SERVE     a port (0: any free one): instead of writing a file,
#                    serve the profile so far as Firefox Profiler JSON, and
#                    in Strobe's own format, on 127.0.0.1 (see
#                    Strobe::Serve), and once the program ends, keep
#                    serving it until INT or TERM (a program ended by TERM
#                    is not served any longer). A process that cannot bind
#                    the port (a child of the first) is not profiled.
#
# The profile is written when the program exits, after the program's own
# at_exit handlers (this one is registered first, so it runs last). A bad
# setting or a failure is reported as one `strobe: ...` line on stderr and
# never stops the program. Forked children do not write the profile: only the
# process that started profiling does. Every Ruby process started with this
# RUBYOPT profiles itself: with STROBE_OUT they all write that one file (the
# one that exits last wins), with STROBE_OUT_DIR each its own.

module Strobe
  # Reads the STROBE_* environment and profiles the current process.
  class Autorun
    DEFAULT_OUT = "strobe-profile.json"

    def initialize(env = ENV, err: $stderr)
      @env = env
      @err = err
      @pid = nil
    end

    # Starts profiling and arranges for the profile to be written at exit.
    # Returns true when profiling started.
    def start
      require_relative "../strobe"
      return continuous if continuous_wanted?
      return toggle if present("STROBE_SIGNAL")
      return serve if present("STROBE_SERVE")

      opts = options
      out = opts.fetch(:out)
      unless Strobe.start(**opts)
        warn_line "the profiler is already running; not profiling this program"
        return false
      end

      @pid = Process.pid
      at_exit { finish(out) }
      true
    rescue StandardError, ScriptError => e
      warn_line "not profiling: #{e.message}"
      false
    end

    # The options for Strobe.start from the environment; raises ArgumentError
    # for a value that cannot be used.
    def options
      # STROBE_RAW unset: the default (on for the formats built from raw samples)
      opts = { mode: (@env["STROBE_MODE"] || "wall").strip, raw: present("STROBE_RAW") && flag("STROBE_RAW"),
               ignore_gc: flag("STROBE_IGNORE_GC"), native: flag("STROBE_NATIVE"),
               out: File.expand_path(present("STROBE_OUT") || DEFAULT_OUT) }
      if (dir = present("STROBE_OUT_DIR"))
        opts[:out] = File.join(File.expand_path(dir), "#{Process.pid}.json")
        opts[:metadata] = { command: [$PROGRAM_NAME, *ARGV].join(" ") }
      end
      interval = present("STROBE_INTERVAL")
      opts[:interval] = integer("STROBE_INTERVAL", interval) if interval
      format = present("STROBE_FORMAT")
      opts[:format] = format.to_sym if format
      opts
    end

    # STROBE_CONTINUOUS_URL or STROBE_PPROF_LISTEN: continuous profiling
    # (Strobe::Continuous::FromEnv). Returns true when it runs.
    def continuous
      require_relative "continuous"
      require_relative "continuous/from_env"
      @err.puts "strobe: #{Continuous::FromEnv.new(@env).start(@err)}"
      true
    rescue StandardError, ScriptError => e
      warn_line "not profiling: #{e.message}"
      false
    end

    # STROBE_SIGNAL: profiling toggled by a signal. Returns true when the
    # toggle is in place.
    def toggle
      opts = options
      out = present("STROBE_OUT")
      opts.delete(:out)
      signal = present("STROBE_SIGNAL")
      Strobe.toggle_on(signal, **opts, path: out ? File.expand_path(out) : Dir.pwd)
      @err.puts "strobe: send SIG#{signal.delete_prefix('SIG').upcase} to #{Process.pid} to start or stop profiling"
      true
    rescue StandardError => e
      warn_line "not profiling: #{e.message}"
      false
    end

    # STROBE_SERVE: profiling from the start, the profile served over HTTP.
    # Returns true when both are running.
    def serve
      require_relative "serve"
      port = integer("STROBE_SERVE", present("STROBE_SERVE"))
      raise ArgumentError, "STROBE_SERVE must be a port from 0 to 65535, got #{port}" unless port.between?(0, 65_535)

      opts = servable(options.slice(:mode, :interval, :ignore_gc, :native).merge(raw: true))
      begin
        server = Serve.new(port, err: @err)
      rescue SystemCallError => e
        warn_line "not profiling this process: cannot serve on 127.0.0.1:#{port} (#{e.message.sub(/ - .*/, '')})"
        return false
      end
      # Ruby processes this one starts try the port it has (with
      # STROBE_SERVE=0, another free one each): they cannot bind it, so
      # only this process serves.
      @env["STROBE_SERVE"] = server.port.to_s
      server.start
      unless Strobe.start(**opts)
        server.stop
        warn_line "the profiler is already running; not serving this program's profile"
        return false
      end

      @pid = Process.pid
      # Before the announcement: a Ctrl-C as soon as it is read still
      # leaves the profile served.
      at_exit { keep_serving(server) }
      @err.puts "strobe: serving the profile of process #{@pid} at #{server.url}"
      @err.puts "strobe: in Strobe's format at #{server.strobe_url} (strobe report reads it)"
      @err.puts "strobe: open #{server.profiler_url}"
      true
    rescue StandardError => e
      server&.stop
      warn_line "not profiling: #{e.message}"
      false
    end

    private

    def continuous_wanted?
      present("STROBE_CONTINUOUS_URL") || present("STROBE_PPROF_LISTEN")
    end

    # The options STROBE_SERVE profiles with, checked before the port is
    # bound: Strobe.start would refuse them only once the server runs.
    def servable(opts)
      if opts[:mode].to_s == "trace"
        raise ArgumentError, "STROBE_MODE=trace cannot be served (the Firefox export is of samples: use wall, cpu, " \
                             "object or custom)"
      end
      Options.new(opts)
      opts
    end

    # How often keep_serving looks for INT or TERM (trap handlers only
    # queue them): a timed wait is never taken for a deadlock by Ruby, even
    # when the program has killed every other thread.
    WAIT_STEP = 0.2

    # At exit: profiling stops, the profile stays served until INT or TERM.
    # What the program wrote is flushed first, and how it ended is said
    # (Ruby prints an uncaught exception's backtrace only after this). A
    # program ended by a signal other than INT (TERM from a process manager,
    # say) ends the serving too: one TERM ends both. Server threads the
    # program killed are started again first.
    def keep_serving(server)
      return unless Process.pid == @pid

      error = $! # what ended the program, if anything
      Strobe.stop
      [$stdout, $stderr].each { |io| io.flush rescue nil } # rubocop:disable Style/RescueModifier
      ended = how_it_ended(error)
      if error.is_a?(SignalException) && !error.is_a?(Interrupt)
        server.stop
        return @err.puts("strobe: #{ended}; its profile is no longer served")
      end
      unless server.revive
        server.stop
        return @err.puts("strobe: #{ended}; its profile cannot be served any more (the server has stopped)")
      end

      @err.puts "strobe: #{ended}; its profile is still served at #{server.url} (Ctrl-C to quit)"
      done = Queue.new
      %w[INT TERM].each { |signal| trap(signal) { done << signal } }
      sleep WAIT_STEP while done.empty?
      server.stop
    rescue SignalException # INT or TERM before the traps were in place
      server.stop
    end

    def how_it_ended(error)
      case error
      when nil then "the program has finished"
      when SystemExit then error.success? ? "the program has finished" : "the program exited with status #{error.status}"
      when Interrupt then "the program was interrupted"
      when SignalException then "the program was ended by #{error.signm}"
      else "the program ended with #{error.class}: #{error.message.lines.first&.chomp}"
      end
    end

    def finish(out)
      return unless Process.pid == @pid

      Strobe.stop
      Strobe.results(out)
    rescue StandardError => e
      warn_line "could not write the profile to #{out}: #{e.is_a?(AtomicFile::TargetError) ? e.reason : e.message}"
    end

    def present(name)
      value = @env[name]&.strip
      value unless value.nil? || value.empty?
    end

    def flag(name)
      Options.env_flag(name, @env[name])
    end

    def integer(name, value)
      Integer(value, 10)
    rescue ArgumentError
      raise ArgumentError, "#{name} must be an integer, got #{value.inspect}"
    end

    def warn_line(message)
      @err.puts "strobe: #{message.to_s.lines.first.to_s.chomp}"
    rescue StandardError
      nil
    end
  end
end

Strobe::Autorun.new.start
