# frozen_string_literal: true

# `strobe run`: its options, the profiled command's run, and what is kept of
# it (the profile, or one per Ruby process and their merge) and reported.

module Strobe
  class CLI
    # `strobe run [options] [--] COMMAND...` (included into CLI).
    module RunCommand
      # The rows of the text report `strobe run` prints (--limit changes it).
      RUN_LIMIT = 30

      def run_command(args)
        settings = { mode: "wall", interval: nil, raw: nil, profile: DEFAULT_PROFILE, out: nil, limit: RUN_LIMIT,
                     sort_by_total: false, quiet: false }
        run_parser(settings).order!(args) # stops at COMMAND, so its own options are left alone
        raise UsageError, "run: no COMMAND given (see strobe run --help)" if args.empty?

        profile = File.expand_path(settings[:profile])
        report = settings[:out] && File.expand_path(settings[:out])
        check_run_settings(settings, profile, report)
        dir = run_directory(profile)
        begin
          status = spawn_and_wait(run_env(settings, dir), args)
          return status if status.is_a?(Integer) # could not start it

          finish_run(args, status, profile, dir, settings.merge(out: report))
        ensure
          FileUtils.rm_rf(dir)
        end
      end

      private

      def run_parser(settings)
        OptionParser.new do |parser|
          parser.banner = "Usage: strobe run [options] [--] COMMAND [ARGS...]"
          parser.separator ""
          parser.separator "Runs COMMAND (e.g. `ruby app.rb`) with every Ruby process it starts profiled by Strobe"
          parser.separator "(through RUBYOPT), writes the profile, then prints the text report of its top #{RUN_LIMIT} frames."
          parser.separator "Exits with COMMAND's status. Strobe writes its messages and the report on standard error:"
          parser.separator "standard output is COMMAND's alone. When several Ruby processes ran, each keeps its own"
          parser.separator "profile (PROFILE.PID.json, listed), PROFILE is their merge, and the report is of the merge."
          parser.separator ""
          parser.separator "Options:"
          sampling_options(parser, settings)
          parser.on("--[no-]raw", "Keep the raw samples in the profile, for flamegraphs, timelines and the exports " \
                                  "(the default, except in mode trace)") { |raw| settings[:raw] = raw }
          parser.on("--profile FILE", "Where to write the profile (default: #{DEFAULT_PROFILE} in the current directory; " \
                                      "gzipped when FILE ends in .gz)") do |file|
            settings[:profile] = file
          end
          parser.on("-o", "--out FILE", "Write the report to FILE instead of standard error") { |file| settings[:out] = file }
          parser.on("-q", "--quiet", "Write the profile only: no report, and no messages but errors") do
            settings[:quiet] = true
          end
          report_options(parser, settings, default_limit: RUN_LIMIT)
          common_options(parser)
        end
      end

      def check_run_settings(settings, profile, report)
        unless MODES.include?(settings[:mode])
          raise UsageError, "run: invalid mode: #{settings[:mode]} (use one of #{MODES.join(', ')})"
        end
        raise UsageError, "run: --quiet writes no report, and -o FILE asks for one: give one of them" if report && settings[:quiet]
        raise UsageError, "run: -o and --profile name the same file (#{profile})" if report == profile
        if report&.match?(/\.json(\.gz)?\z/i)
          raise UsageError, "run: -o FILE is where the text report goes; write the profile with --profile #{settings[:out]}"
        end

        throw :exit, 1 if settings[:native] && !require_engine # Options checks that it has libunwind
        begin
          # What the profiled program's autorun checks (the options from here
          # and STROBE_IGNORE_GC from the environment), and the profile's path.
          ignore_gc = Options.env_flag("STROBE_IGNORE_GC", ENV["STROBE_IGNORE_GC"])
          if settings[:mode] == "trace" && (settings[:raw] || ignore_gc)
            raise ArgumentError, "#{settings[:raw] ? '--raw' : 'STROBE_IGNORE_GC'} is about samples, and mode trace " \
                                 "records none (it counts calls and times): leave it out"
          end
          Options.new(mode: settings[:mode], interval: settings[:interval], native: settings[:native],
                      raw: raw?(settings), ignore_gc: ignore_gc, out: profile)
        rescue ArgumentError => e
          raise UsageError, "run: #{e.message.sub(/\Aout path/, 'profile path')}"
        end
        check_report_path(report) if report
      end

      # The report's file must be writable before the command runs, as the
      # profile's: a long run should not end in a report that cannot be
      # written.
      def check_report_path(path)
        dir = File.dirname(path)
        problem = if !File.directory?(dir) then "directory #{dir} does not exist"
                  elsif !File.writable?(dir) then "directory #{dir} is not writable"
                  elsif File.directory?(path) then "it is a directory"
                  end
        raise UsageError, "run: cannot write the report to #{path}: #{problem}" if problem
      end

      # A new private directory next to the profile, where each Ruby process
      # the command starts writes its own profile (PID.json): next to it, so
      # that they can be renamed into place.
      def run_directory(profile)
        dir = File.join(File.dirname(profile), ".strobe-run-#{SecureRandom.hex(8)}")
        Dir.mkdir(dir, 0o700)
        dir
      rescue SystemCallError => e
        raise UsageError, "run: cannot write next to #{profile}: #{system_reason(e)}"
      end

      # Raw samples unless --no-raw: a profile from strobe run then makes a
      # flamegraph, a timeline and every export (mode trace records none).
      def raw?(settings)
        settings[:raw].nil? ? settings[:mode] != "trace" : settings[:raw]
      end

      # The child's environment: Strobe is loaded by RUBYOPT and configured by
      # STROBE_*; a nil value removes a variable inherited from our environment.
      def run_env(settings, dir)
        ruby_env.merge(
          "STROBE_MODE" => settings[:mode],
          "STROBE_INTERVAL" => settings[:interval]&.to_s,
          "STROBE_RAW" => raw?(settings) ? "1" : "0",
          "STROBE_NATIVE" => settings[:native] ? "1" : "0",
          "STROBE_FORMAT" => nil, # the profile is Strobe's own JSON, whatever the environment says
          "STROBE_OUT" => nil,
          "STROBE_OUT_DIR" => dir,
          "STROBE_SIGNAL" => nil,
          "STROBE_SERVE" => nil,
        )
      end

      # Runs command with our stdio and returns its Process::Status, or an exit
      # status when it could not be started. While it runs, Ctrl-C is left to
      # the child (it gets it from the terminal too) so that it can write its
      # profile, and TERM is passed on to it.
      def spawn_and_wait(env, command)
        pid = Process.spawn(env, *command)
        previous = { "INT" => trap("INT") {}, "TERM" => trap("TERM") { signal_child(pid, "TERM") } }
        begin
          Process.wait2(pid).last
        ensure
          previous.each { |signal, handler| trap(signal, handler || "SYSTEM_DEFAULT") }
        end
      rescue SystemCallError => e
        error "cannot run #{command.first}: #{system_reason(e)}"
      end

      def signal_child(pid, signal)
        Process.kill(signal, pid)
      rescue SystemCallError
        nil
      end

      # One Ruby process profiled: its profile becomes the profile. Several (a
      # Rakefile running tests, a script running others): each keeps its own,
      # as PROFILE.PID.json, the profile is their merge, and the report is of
      # the merge.
      def finish_run(command, status, profile, dir, settings)
        child_status = exit_status(status)
        files = Dir.glob(File.join(dir, "*.json")).sort_by { |f| [File.mtime(f), f] }
        if files.empty?
          error "#{command.join(' ')} #{describe(status)} without writing a profile to #{profile}"
          return child_status.zero? ? 1 : child_status
        end

        quiet = settings[:quiet]
        kept = files.size == 1 ? keep_one(files.first, profile, quiet) : keep_each(files, profile, command, quiet)
        return kept unless kept.zero?

        report_status = quiet ? 0 : run_report(profile, settings)
        report_status.zero? ? child_status : report_status
      end

      # The process wrote its profile as JSON: renamed into place, or for a
      # name ending in .gz gzipped into place (as Strobe.save writes such a
      # name).
      def keep_one(file, profile, quiet)
        if profile.end_with?(".gz")
          AtomicFile.write(profile) do |out|
            gzip = Zlib::GzipWriter.new(out)
            File.open(file, "rb") { |json| IO.copy_stream(json, gzip) }
            gzip.finish
          end
        else
          File.rename(file, profile)
        end
        @err.puts "strobe: profile written to #{profile}" unless quiet
        0
      rescue SystemCallError => e
        error "cannot write #{profile}: #{system_reason(e)}"
      end

      def keep_each(files, profile, command, quiet)
        return 1 unless require_engine

        base = profile.sub(/\.json(\.gz)?\z/, "")
        kept = files.map do |file|
          pid = File.basename(file, ".json")
          path = "#{base}.#{pid}.json"
          File.rename(file, path)
          [pid, path]
        end
        results = kept.map { |_, path| load_profile(path) || (return 1) }
        merged = Merge.results(results, kept.map(&:last))
        merged[:metadata] = merged[:metadata].merge(command: command.join(" "), processes: kept.size)
        Strobe.save(merged, profile)
        return 0 if quiet

        @err.puts "strobe: #{kept.size} Ruby processes profiled; their merged profile is in #{profile}, each one's in:"
        kept.zip(results).each do |(pid, path), result|
          command = Report.printable(result.dig(:metadata, :command).to_s)
          @err.puts format("  %-28s pid %-8s %8d samples  %s", File.basename(path), pid, result[:samples], command)
        end
        busiest = kept.zip(results).max_by { |_, result| result[:samples].to_i }.first.last
        @err.puts "strobe: report on one with: strobe report #{busiest}"
        0
      rescue ArgumentError, Strobe::ProfileError => e
        error "cannot merge the profiles: #{e.message}"
      rescue SystemCallError => e
        error "cannot write #{profile}: #{system_reason(e)}"
      end

      # The text report of the profile: on err, or to settings[:out].
      def run_report(profile, settings)
        status = print_report([profile], limit: settings[:limit], sort_by_total: settings[:sort_by_total],
                                         out: settings[:out], stream: @err)
        @err.puts "strobe: report written to #{settings[:out]}" if status.zero? && settings[:out]
        status
      end

      def exit_status(status)
        return status.exitstatus if status.exitstatus
        return 128 + status.termsig if status.signaled?

        1
      end

      def describe(status)
        if status.signaled?
          "was killed by signal #{Signal.signame(status.termsig) || status.termsig}"
        else
          "exited with status #{status.exitstatus}"
        end
      end
    end
  end
end
