# frozen_string_literal: true

require "fileutils"
require "optparse"
require "pp"
require "securerandom"
require_relative "version"
require_relative "options"
require_relative "report"
require_relative "merge"
require_relative "atomic_file"

module Strobe
  # The `strobe` command line:
  #
  #   strobe run [options] [--] COMMAND...   profile COMMAND, then report
  #   strobe report [options] FILE...        report on saved profiles
  #   strobe serve [options] [--] COMMAND... run COMMAND, serving its profile
  #                                          to the Firefox Profiler
  #
  # Strobe::CLI.new(argv).run returns the exit status instead of exiting, and
  # reports every problem as one `strobe: ...` line on err, never a backtrace.
  class CLI
    DEFAULT_OUT = "strobe-profile.json"
    DEFAULT_PORT = 5150
    LIB_DIR = File.expand_path("..", __dir__)
    AUTORUN = File.expand_path("autorun.rb", __dir__)
    MODES = Options::MODES.map(&:to_s).freeze

    # A command line that cannot be carried out; its message is shown as is.
    class UsageError < StandardError; end

    def initialize(argv, out: $stdout, err: $stderr, input: $stdin)
      @argv = argv.dup
      @out = out
      @err = err
      @in = input
    end

    # Runs the command line and returns the exit status.
    def run
      catch(:exit) { dispatch(@argv.dup) }
    rescue OptionParser::ParseError => e
      error "#{e.message} (see strobe #{"#{@command} " if @command}--help)"
    rescue UsageError => e
      error e.message
    rescue Errno::EPIPE
      0 # the reader of our output went away (e.g. `| head`)
    rescue Interrupt
      130
    rescue NoMemoryError
      error "out of memory#{" (#{@command})" if @command}: the profile needs more than this machine gives"
    rescue StandardError => e
      raise if ENV["STROBE_DEBUG"]

      error "#{e.class}: #{e.message.lines.first&.chomp} (STROBE_DEBUG=1 shows the backtrace)"
    end

    private

    def dispatch(args)
      command = args.shift
      case command
      when "run", "report", "serve"
        @command = command
        public_send(:"#{command}_command", args)
      when "help" then help(args.first)
      when "-h", "--help" then help(nil)
      when "-v", "--version" then version
      when nil
        @err.puts general_help
        1
      when /\A-/ then raise OptionParser::InvalidOption, command
      else raise UsageError, "unknown command: #{command} (commands: run, report, serve; see strobe --help)"
      end
    end

    # --- strobe run ----------------------------------------------------------

    public def run_command(args)
      settings = { mode: "wall", interval: nil, raw: false, out: DEFAULT_OUT, limit: nil, sort_by_total: false }
      run_parser(settings).order!(args) # stops at COMMAND, so its own options are left alone
      raise UsageError, "run: no COMMAND given (see strobe run --help)" if args.empty?

      out = File.expand_path(settings[:out])
      check_run_settings(settings, out)
      dir = run_directory(out)
      begin
        status = spawn_and_wait(run_env(settings, dir), args)
        return status if status.is_a?(Integer) # could not start it

        finish_run(args, status, out, dir, settings)
      ensure
        FileUtils.rm_rf(dir)
      end
    end

    def run_parser(settings)
      OptionParser.new do |parser|
        parser.banner = "Usage: strobe run [options] [--] COMMAND [ARGS...]"
        parser.separator ""
        parser.separator "Runs COMMAND (e.g. `ruby app.rb`) with every Ruby process it starts profiled by Strobe"
        parser.separator "(through RUBYOPT), then prints the text report of the profile. Exits with COMMAND's status."
        parser.separator "When several Ruby processes ran, each keeps its own profile (OUT.PID.json, listed), OUT is"
        parser.separator "their merge, and the report is of the merge."
        parser.separator ""
        parser.separator "Options:"
        sampling_options(parser, settings)
        parser.on("--raw", "Keep the raw samples in the profile (for flame graphs)") { settings[:raw] = true }
        parser.on("-o", "--out FILE", "Where to write the profile (default: #{DEFAULT_OUT} in the current directory)") do |file|
          settings[:out] = file
        end
        report_options(parser, settings)
        common_options(parser)
      end
    end

    def check_run_settings(settings, out)
      unless MODES.include?(settings[:mode])
        raise UsageError, "run: invalid mode: #{settings[:mode]} (use one of #{MODES.join(', ')})"
      end

      # The profiler's own checks of the interval and of the out path.
      Options.new(mode: settings[:mode], interval: settings[:interval], native: settings[:native], out: out)
      if [LIB_DIR, out].any? { |path| path.match?(/\s/) }
        raise UsageError, "cannot run with a space in Strobe's directory (#{LIB_DIR}) or in the profile path " \
                          "(#{out}): RUBYOPT and the environment cannot carry it"
      end
    rescue ArgumentError => e
      raise UsageError, "run: #{e.message}"
    end

    # A new private directory next to out, where each Ruby process the
    # command starts writes its own profile (PID.json): next to it, so
    # that they can be renamed into place.
    def run_directory(out)
      dir = File.join(File.dirname(out), ".strobe-run-#{SecureRandom.hex(8)}")
      Dir.mkdir(dir, 0o700)
      dir
    rescue SystemCallError => e
      raise UsageError, "run: cannot write next to #{out}: #{system_reason(e)}"
    end

    # The child's environment: Strobe is loaded by RUBYOPT and configured by
    # STROBE_*; a nil value removes a variable inherited from our environment.
    def run_env(settings, dir)
      ruby_env.merge(
        "STROBE_MODE" => settings[:mode],
        "STROBE_INTERVAL" => settings[:interval]&.to_s,
        "STROBE_RAW" => settings[:raw] ? "1" : "0",
        "STROBE_NATIVE" => settings[:native] ? "1" : "0",
        "STROBE_OUT" => nil,
        "STROBE_OUT_DIR" => dir,
        "STROBE_SIGNAL" => nil,
        "STROBE_SERVE" => nil,
      )
    end

    # RUBYOPT loading Strobe's autorun into every Ruby process.
    def ruby_env
      { "RUBYOPT" => [ENV["RUBYOPT"], "-I#{LIB_DIR}", "-r#{AUTORUN}"].compact.reject(&:empty?).join(" ") }
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

    # One Ruby process profiled: its profile becomes out. Several (a Rakefile
    # running tests, a script running others): each keeps its own, as
    # OUT.PID.json, out is their merge, and the report is of the merge.
    def finish_run(command, status, out, dir, settings)
      child_status = exit_status(status)
      files = Dir.glob(File.join(dir, "*.json")).sort_by { |f| [File.mtime(f), f] }
      if files.empty?
        error "#{command.join(' ')} #{describe(status)} without writing a profile to #{out}"
        return child_status.zero? ? 1 : child_status
      end

      report_status = files.size == 1 ? keep_one(files.first, out, settings) : keep_each(files, out, settings, command)
      report_status.zero? ? child_status : report_status
    end

    def keep_one(file, out, settings)
      File.rename(file, out)
      @out.puts "strobe: profile written to #{out}"
      print_report([out], limit: settings[:limit], sort_by_total: settings[:sort_by_total])
    rescue SystemCallError => e
      error "cannot write #{out}: #{system_reason(e)}"
    end

    def keep_each(files, out, settings, command)
      return 1 unless require_engine

      base = out.sub(/\.json(\.gz)?\z/, "")
      kept = files.map do |file|
        pid = File.basename(file, ".json")
        path = "#{base}.#{pid}.json"
        File.rename(file, path)
        [pid, path]
      end
      results = kept.map { |_, path| load_profile(path) || (return 1) }
      merged = Merge.results(results, kept.map(&:last))
      merged[:metadata] = merged[:metadata].merge(command: command.join(" "), processes: kept.size)
      Strobe.save(merged, out)
      @out.puts "strobe: #{kept.size} Ruby processes profiled; their merged profile is in #{out}, each one's in:"
      kept.zip(results).each do |(pid, path), result|
        command = Report.printable(result.dig(:metadata, :command).to_s)
        @out.puts format("  %-28s pid %-8s %8d samples  %s", File.basename(path), pid, result[:samples], command)
      end
      @out.puts "strobe: report on one with: strobe report #{kept.first.last}"
      print_report([out], limit: settings[:limit], sort_by_total: settings[:sort_by_total])
    rescue ArgumentError, Strobe::ProfileError => e
      error "cannot merge the profiles: #{e.message}"
    rescue SystemCallError => e
      error "cannot write #{out}: #{system_reason(e)}"
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

    # --- strobe serve --------------------------------------------------------

    # Runs COMMAND in place of this process (exec), with every Ruby process
    # it starts set up by RUBYOPT and STROBE_SERVE to profile itself and
    # serve its profile (see Strobe::Serve); the first to bind the port
    # serves. Returns only when COMMAND cannot be run.
    public def serve_command(args)
      settings = { mode: "wall", interval: nil, port: DEFAULT_PORT }
      serve_parser(settings).order!(args)
      raise UsageError, "serve: no COMMAND given (see strobe serve --help)" if args.empty?
      unless MODES.include?(settings[:mode])
        raise UsageError, "serve: invalid mode: #{settings[:mode]} (use one of #{MODES.join(', ')})"
      end
      if settings[:mode] == "trace"
        raise UsageError, "serve: mode trace cannot be served (the Firefox Profiler shows samples: use one of " \
                          "#{(MODES - ['trace']).join(', ')})"
      end

      begin
        Options.new(mode: settings[:mode], interval: settings[:interval], native: settings[:native])
      rescue ArgumentError => e
        raise UsageError, "serve: #{e.message}"
      end
      raise UsageError, "cannot serve with a space in Strobe's directory (#{LIB_DIR})" if LIB_DIR.match?(/\s/)

      env = ruby_env.merge("STROBE_MODE" => settings[:mode], "STROBE_INTERVAL" => settings[:interval]&.to_s,
                           "STROBE_NATIVE" => settings[:native] ? "1" : "0",
                           "STROBE_SERVE" => settings[:port].to_s, "STROBE_SIGNAL" => nil, "STROBE_OUT" => nil,
                           "STROBE_OUT_DIR" => nil)
      Process.exec(env, *args)
    rescue SystemCallError => e
      error "cannot run #{args.first}: #{system_reason(e)}"
    end

    def serve_parser(settings)
      OptionParser.new do |parser|
        parser.banner = "Usage: strobe serve [options] [--] COMMAND [ARGS...]"
        parser.separator ""
        parser.separator "Runs COMMAND (e.g. `ruby app.rb`) profiled by Strobe, and serves the profile collected so"
        parser.separator "far on http://127.0.0.1:PORT/TOKEN/profile.json for the Firefox Profiler; the link to open"
        parser.separator "is printed on stderr. TOKEN is random: only who has the link can read the profile, and"
        parser.separator "only the Firefox Profiler's page (https://profiler.firefox.com) may read it from a browser."
        parser.separator "When COMMAND's Ruby program ends, its profile stays served until Ctrl-C (or TERM); a"
        parser.separator "program ended by TERM is not served any longer. Mode trace is not served."
        parser.separator ""
        parser.separator "Options:"
        sampling_options(parser, settings)
        parser.on("-p", "--port N", Integer, "Port on 127.0.0.1 (default: #{DEFAULT_PORT}; 0: any free port)") do |n|
          raise OptionParser::InvalidArgument, "#{n} (must be from 0 to 65535)" unless n.between?(0, 65_535)

          settings[:port] = n
        end
        common_options(parser)
      end
    end

    # --- strobe report -------------------------------------------------------

    # The report formats: option => [Report method, description].
    FORMATS = {
      text: "Frames by self samples, stackprof's text layout (the default)",
      files: "Samples per source file",
      file: "Annotated source of the files whose path ends with (or else contains) PATH (--file PATH)",
      method: "Callers, callees and annotated source of METHOD (--method NAME, or a part of it; /regexp/ for a Regexp)",
      graphviz: "Call graph in Graphviz DOT (render with dot -Tsvg)",
      callgrind: "Callgrind format, for KCachegrind or callgrind_annotate",
      stackcollapse: "Folded stacks for flamegraph.pl, inferno or speedscope (needs --raw)",
      json: "The profile as stackprof-layout JSON",
      flamegraph: "A self-contained HTML flamegraph with zoom, search and a timeline (needs --raw)",
      sampling_prof: "SamplingProf's text format: runtime, call elements, counts, call graph (needs --raw)",
      pprof: "pprof's gzipped profile.proto, for go tool pprof, Pyroscope or Grafana (needs --raw; binary: use -o)",
      firefox: "Firefox Profiler JSON: a track per thread, open it at https://profiler.firefox.com (needs --raw)",
      speedscope: "speedscope's JSON file format, a profile per thread (needs --raw)",
    }.freeze

    # stackprof's report flags, so that `stackprof FILE --FLAG` scripts work
    # as `strobe report FILE --FLAG`: their formats, written by Strobe.
    STACKPROF_FORMATS = {
      timeline_flamegraph: "The HTML flamegraph, opening on its timeline",
      alphabetical_flamegraph: "The HTML flamegraph, opening on its aggregated view",
      d3_flamegraph: "The HTML flamegraph, opening on its aggregated view",
      dump: "The merged profile as a Marshal dump (stackprof's file format)",
      debug: "The profile Hash, pretty-printed",
    }.freeze

    public def report_command(args)
      settings = { limit: nil, sort_by_total: false, thread: nil, endpoint: nil, format: nil, filters: {}, node_fraction: 0.005 }
      report_parser(settings).parse!(args)
      raise UsageError, "report: no FILE given (see strobe report --help)" if args.empty?

      print_report(args, **settings)
    end

    def report_parser(settings)
      OptionParser.new do |parser|
        parser.banner = "Usage: strobe report [options] FILE..."
        parser.separator ""
        parser.separator "Reports on profiles written by Strobe (JSON, or gzipped JSON). Several files of the same"
        parser.separator "mode and interval are merged into one report."
        parser.separator ""
        parser.separator "Formats (one):"
        format_options(parser, settings)
        parser.separator ""
        parser.separator "Options:"
        report_options(parser, settings)
        parser.on("--node-fraction F", Float, "For --graphviz: leave out frames under this fraction of the samples " \
                                              "(default 0.005)") do |f|
          raise OptionParser::InvalidArgument, "#{f} (must be from 0 to 1)" unless f.between?(0, 1)

          settings[:node_fraction] = f
        end
        filter_options(parser, settings)
        parser.on("--thread ID", Integer, "Only the samples of thread ID (a key of the profile's threads; needs --raw)") do |id|
          settings[:thread] = id
        end
        parser.on("--endpoint NAME", "Only the samples taken serving requests to NAME (Strobe::Middleware's endpoints: " \
                                     "PostsController#index, or GET /posts; needs --raw)") do |name|
          settings[:endpoint] = name
        end
        parser.on("--walk", "With --method: then choose a caller or callee to show next, and so on") do
          settings[:walk] = true
        end
        parser.on("-o", "--out FILE", "Write the report to FILE instead of standard output") { |f| settings[:out] = f }
        parser.on("--marshal", "Also load Marshal dumps (stackprof's format). Marshal data can run code: " \
                               "only for files you trust") { settings[:marshal] = true }
        common_options(parser)
      end
    end

    def format_options(parser, settings)
      chosen = lambda do |format, value = true|
        if settings[:format] && settings[:format] != format
          raise UsageError, "report: one format at a time (got --#{settings[:format].to_s.tr("_", "-")} and --#{format.to_s.tr("_", "-")})"
        end

        settings[:format] = format
        settings[:format_arg] = value
      end
      FORMATS.each do |format, description|
        case format
        when :file then parser.on("--file PATH", description) { |path| chosen.(format, path) }
        when :method then parser.on("--method NAME", description) { |name| chosen.(format, name) }
        else parser.on("--#{format.to_s.tr('_', '-')}", description) { chosen.(format) }
        end
      end
      parser.separator ""
      parser.separator "stackprof's report flags, also accepted:"
      STACKPROF_FORMATS.each do |format, description|
        parser.on("--#{format.to_s.tr('_', '-')}", description) { chosen.(format) }
      end
      parser.on("--flamegraph-viewer FILE", "Print how to open FILE, an HTML flamegraph (stackprof opens its viewer)") do |file|
        @out.puts "open file://#{File.expand_path(file)}"
        throw :exit, 0
      end
    end

    def filter_options(parser, settings)
      {
        select_files: ["--select-files PATH", "Only frames in files under PATH (repeatable)"],
        reject_files: ["--reject-files PATH", "Leave out frames in files under PATH (repeatable)"],
        select_names: ["--select-names REGEXP", "Only frames whose name matches REGEXP (repeatable)"],
        reject_names: ["--reject-names REGEXP", "Leave out frames whose name matches REGEXP (repeatable)"],
      }.each do |key, (switch, description)|
        parser.on(switch, description) do |value|
          value = to_regexp(value) if key.to_s.end_with?("names")
          (settings[:filters][key] ||= []) << value
        end
      end
    end

    def to_regexp(source)
      Regexp.new(source)
    rescue RegexpError => e
      raise OptionParser::InvalidArgument, "#{source} (#{e.message})"
    end

    # Loads, merges and reports; returns the exit status.
    def print_report(paths, limit:, sort_by_total:, thread: nil, endpoint: nil, format: nil, format_arg: nil, filters: {},
                     node_fraction: 0.005, out: nil, marshal: false, walk: false)
      raise UsageError, "report: --walk goes with --method NAME" if walk && format != :method

      results = []
      paths.each do |path|
        result = load_profile(path, marshal: marshal)
        return 1 unless result # its one error line is printed

        results << result
      end

      begin
        result = Merge.results(results, paths)
        report = Report.new(result, thread: thread, endpoint: endpoint, **filters)
        write_report(out) do |io|
          if walk
            report.walk_method(@in, io, method_pattern(format_arg))
            next 0
          end
          render(report, io, format || :text, format_arg, limit: limit, sort_by_total: sort_by_total,
                                                          node_fraction: node_fraction)
        end
      rescue ArgumentError, Strobe::ProfileError => e
        error "cannot report on #{paths.join(', ')}: #{e.message}"
      end
    end

    def render(report, io, format, arg, limit:, sort_by_total:, node_fraction:)
      if format == :pprof && io.respond_to?(:tty?) && io.tty?
        raise UsageError, "report: --pprof writes binary data: give -o FILE (e.g. -o profile.pb.gz) or redirect it"
      end

      case format
      when :text then report.print_text(io, limit: limit, sort_by_total: sort_by_total)
      when :files then report.print_files(io, limit: limit, sort_by_total: sort_by_total)
      when :file then report.print_file(io, arg)
      when :method then report.print_method(io, method_pattern(arg))
      when :graphviz then report.print_graphviz(io, node_fraction: node_fraction, limit: limit)
      when :timeline_flamegraph then report.print_flamegraph(io, view: :timeline)
      when :alphabetical_flamegraph, :d3_flamegraph then report.print_flamegraph(io, view: :aggregated)
      when :dump then io.puts Marshal.dump(report.result)
      when :debug then PP.pp(report.result, io)
      else report.public_send("print_#{format}", io)
      end
      0
    end

    # "/re/" is a Regexp; anything else an exact name.
    def method_pattern(name)
      return name unless name.length > 2 && name.start_with?("/") && name.end_with?("/")

      Regexp.new(name[1..-2])
    rescue RegexpError => e
      raise ArgumentError, "--method #{name}: #{e.message}"
    end

    # Yields standard output, or a file written whole by AtomicFile (as
    # Strobe.save writes profiles: a failed report leaves no half file, and
    # no symlink is written through), returning the block's status; a file
    # that cannot be written is one error line. Errors writing standard
    # output (a closed pipe) are left to #run.
    def write_report(path)
      return yield(@out) unless path

      begin
        status = nil
        AtomicFile.write(path) { |file| status = yield(file) }
        status
      rescue SystemCallError => e
        error "cannot write #{path}: #{system_reason(e)}"
      end
    end

    def load_profile(path, marshal: false)
      return nil unless require_engine

      begin
        @err.puts "strobe: warning: loading #{path} with Marshal, which can run code from the file" if marshal && marshal_file?(path)
        result = Strobe.load(path, marshal: marshal)
        Report.new(result) # checks the shape
        result
      rescue Strobe::ProfileError, SystemCallError, ArgumentError => e
        error "cannot read profile #{path}: #{load_failure_reason(e, path)}"
        nil
      end
    end

    def marshal_file?(path)
      File.open(path, "rb") { |f| f.read(2) } == ProfileFile::MARSHAL_MAGIC
    rescue SystemCallError
      false
    end

    # Why a profile could not be read, without repeating its path.
    def load_failure_reason(error, path)
      return system_reason(error) if error.is_a?(SystemCallError)

      error.message.delete_prefix("#{path}: ")
    end

    def require_engine
      require_relative "../strobe"
      true
    rescue LoadError => e
      error "cannot load Strobe (is the extension built? try `rake compile`): #{e.message}"
      false
    end

    # --- shared --------------------------------------------------------------

    # --mode and --interval, for the commands that profile.
    def sampling_options(parser, settings)
      parser.on("-m", "--mode MODE", "Sampling mode: #{MODES.join(', ')} (default: wall)") do |mode|
        settings[:mode] = mode
      end
      parser.on("-i", "--interval N", Integer,
                "Sampling interval: microseconds, or allocations in object mode (default: 1000 / 1)") do |n|
        settings[:interval] = n
      end
      parser.on("--native", "Also record native (C) frames, under the Ruby frames that called them (wall, cpu)") do
        settings[:native] = true
      end
    end

    def report_options(parser, settings)
      parser.on("-l", "--limit N", Integer, "Show only the first N frames (0: all, as stackprof)") do |n|
        raise OptionParser::InvalidArgument, "#{n} (must be at least 0)" if n.negative?

        settings[:limit] = n.zero? ? nil : n
      end
      parser.on("--sort-total", "Sort frames by total samples instead of self samples") do
        settings[:sort_by_total] = true
      end
    end

    def common_options(parser)
      parser.on("-h", "--help", "Show this help") do
        @out.puts parser
        throw :exit, 0
      end
      parser.on("-v", "--version", "Show Strobe's version") { throw :exit, version }
    end

    def help(command)
      case command
      when nil then @out.puts general_help
      when "run" then @out.puts run_parser({})
      when "report" then @out.puts report_parser({})
      when "serve" then @out.puts serve_parser({})
      else raise UsageError, "unknown command: #{command} (commands: run, report, serve)"
      end
      0
    end

    def general_help
      <<~HELP
        Usage: strobe COMMAND [options]

        Strobe is a sampling call-stack profiler for Ruby.

        Commands:
          run [options] [--] COMMAND...   Profile COMMAND (e.g. `ruby app.rb`), write the profile
                                          (default: #{DEFAULT_OUT}) and print its report
          report [options] FILE...        Report on saved profiles: text, files, method, graphviz,
                                          callgrind, stackcollapse, json, flamegraph, or exports
                                          for pprof, the Firefox Profiler and speedscope
          serve [options] [--] COMMAND... Profile COMMAND and serve the profile so far to the
                                          Firefox Profiler (the link is printed)
          help [COMMAND]                  Show help for a command

        Options:
          -h, --help                      Show this help
          -v, --version                   Show Strobe's version

        Example:
          strobe run --mode cpu -- ruby examples/busy.rb
      HELP
    end

    def version
      @out.puts "strobe #{VERSION}"
      0
    end

    # The reason without the path and the call Ruby adds ("... @ rb_sysopen - FILE").
    def system_reason(error)
      error.class < SystemCallError ? error.class.new.message : error.message
    end

    # Prints one line on err and returns the exit status 1. Messages quote
    # names from profiles and paths: control characters are escaped (see
    # Report.printable), bytes that are not UTF-8 too.
    def error(message)
      line = Report.printable(message.to_s.b.gsub(/\s+/n, " ").strip)
      line = "#{line[0, 297]}..." if line.length > 300
      @err.puts "strobe: #{line}"
      1
    end
  end
end
