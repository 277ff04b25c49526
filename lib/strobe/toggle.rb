# frozen_string_literal: true

require "fileutils"

module Strobe
  # Profiling switched on and off from outside a running process:
  #
  #   Strobe.toggle_on(:USR2, mode: :cpu, path: "tmp/profiles/")
  #   # kill -USR2 <pid>   starts profiling; kill -USR2 <pid> again stops it
  #   #                    and writes tmp/profiles/strobe-cpu-<pid>-<time>.json
  #
  # Options: those of Strobe.start (not out:), and path: (a directory, the
  # default ".", gets one file per stop, named strobe-MODE-PID-TIME and the
  # format's extension; anything else names the file, and the second and
  # later stops write NAME-2.EXT, NAME-3.EXT, ...) or on_result: (a proc
  # given each result, on a thread of its own, instead of a file).
  #
  # The work is done by the signal's trap handler, which Ruby runs on the
  # main thread at its next safe point. Each start and each stop says so in
  # one line on stderr (the stop naming the file written); a failure there
  # is reported as one line on stderr and never raised into the program.
  class Toggle
    attr_reader :signal

    def initialize(signal, path: ".", **options)
      @signal = Signal.signame(Signal.list.fetch(signal.to_s.delete_prefix("SIG").upcase) do
        raise ArgumentError, "signal #{signal.inspect} is not a signal name"
      end)
      if @signal == Native::SIGNAL
        raise ArgumentError, "signal #{signal.inspect} is the one Strobe samples with: pick another (USR1, USR2, ...)"
      end
      raise ArgumentError, "path must be a String, got #{path.inspect}" unless path.is_a?(String) && !path.empty?
      raise ArgumentError, "out: is not a toggle option: use path:" if options.key?(:out)

      @options = options
      checked = Options.new(options) # every problem with the options, now
      @format = checked.format
      @mode = checked.mode
      @path = path
      @stops = 0
      @previous = nil
      @round = nil # Native.round of the profile this toggle started
    end

    # Traps the signal; returns self. Raises ArgumentError for a signal
    # Ruby reserves.
    def install
      @previous = Signal.trap(@signal) { flip }
      self
    end

    # Puts back the handler the signal had before install.
    def uninstall
      Signal.trap(@signal, @previous || "DEFAULT")
    end

    # Starts profiling, or stops the profile it started and saves it. A
    # profile someone else started (the application's own Strobe.start, a
    # middleware's) is left running, and theirs.
    def flip
      if Strobe.running?
        unless @round && Native.stop_round(@round)
          return warn_line("not stopping: the profile running was not started by #{@signal}")
        end

        @round = nil
        return warn_line("profiling stopped; the result goes to on_result") if @options[:on_result]

        save(Strobe.results)
      elsif Strobe.start_own(nil, **@options)
        @round = Native.round
        warn_line("profiling started (mode #{@mode}); send #{@signal} again to stop")
      else
        warn_line("not starting: another profile is running, or a stopped one waits for Strobe.results")
      end
    rescue StandardError => e
      warn_line(e.message)
    end

    private

    # Writes result and says where, or that it is lost and why. A gzipped
    # file (pprof, a .gz name) is written on a thread of its own: Zlib takes
    # a lock, which Ruby refuses in a trap handler (the profile was lost).
    # At exit the program waits for it, at most SAVE_AT_EXIT seconds.
    def save(result)
      return warn_line("profiling stopped; nothing was profiled") unless result

      @stops += 1
      target = target_path(result)
      return warn_line("profiling stopped; #{write(result, target)}") unless gzipped?(target)

      warn_line("profiling stopped; writing #{File.expand_path(target)}")
      previous = @saving
      @saving_target = target
      @saving = Thread.new do
        quietly_join(previous) # in the order the signals came
        warn_line(write(result, target))
      end
      @wait_at_exit ||= at_exit { wait_for_saving }
    end

    SAVE_AT_EXIT = 30

    def wait_for_saving
      return if quietly_join(@saving, SAVE_AT_EXIT)

      warn_line("the profile is lost: still writing #{File.expand_path(@saving_target)} after #{SAVE_AT_EXIT} s, at exit")
    end

    # Whether thread (or none) is done; what it raised is its own line.
    def quietly_join(thread, seconds = nil)
      !thread || !thread.join(seconds).nil?
    rescue Exception # rubocop:disable Lint/RescueException -- reported by the thread itself
      true
    end

    def gzipped?(target)
      @format == :pprof || target.end_with?(".gz")
    end

    def write(result, target)
      FileUtils.mkdir_p(File.dirname(target))
      Strobe.save(result, target, format: @format)
      "profile written to #{File.expand_path(target)}"
    rescue Exception => e # rubocop:disable Lint/RescueException -- on a thread of its own too: said, not raised
      raise if e.is_a?(SignalException) || e.is_a?(SystemExit)

      "the profile is lost: it could not be written to #{File.expand_path(target)} (#{e.message})"
    end

    def target_path(result)
      return ProfileFile.path_in(@path, result, @format) if ProfileFile.directory?(@path)
      return @path if @stops == 1

      base = @path.sub(/(\.json(\.gz)?|\.txt)\z/, "")
      "#{base}-#{@stops}#{@path.delete_prefix(base)}"
    end

    # One line on stderr, from trap context: with one write(2) when stderr
    # is an IO. IO#puts takes the IO's write lock, and the trap may have
    # interrupted the main thread inside a write of its own to stderr
    # (Ruby 4.0 then raises ThreadError, "recursive locking", and the line
    # was lost: seen when the signal came right after the program printed).
    def warn_line(message)
      line = "strobe: on #{@signal}: #{message.to_s.lines.first.to_s.chomp}\n"
      $stderr.is_a?(IO) ? $stderr.syswrite(line) : $stderr.write(line)
    rescue StandardError
      nil
    end
  end
end
