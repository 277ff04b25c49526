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
  #   strobe report [options] FILE|URL...    report on saved profiles
  #   strobe serve [options] [--] COMMAND... run COMMAND, serving its profile
  #                                          to the Firefox Profiler
  #
  # Strobe::CLI.new(argv).run returns the exit status instead of exiting, and
  # reports every problem as one `strobe: ...` line on err, never a backtrace.
  # `strobe run` writes everything of its own on err: out is the profiled
  # program's.
  class CLI
    DEFAULT_PROFILE = "strobe-profile.json"
    # The rows of the text report `strobe run` prints (--limit changes it).
    RUN_LIMIT = 30
    DEFAULT_PORT = 5150
    LIB_DIR = File.expand_path("..", __dir__)
    AUTORUN = File.expand_path("autorun.rb", __dir__)
    MODES = Options::MODES.map(&:to_s).freeze

    # `strobe report URL`: what may be downloaded (the most the profile
    # loader inflates a file to), and how long the server may keep us waiting.
    URL = %r{\Ahttps?://}i
    DOWNLOAD_LIMIT = ProfileFile::MAX_INFLATED
    DOWNLOAD_TIMEOUT = 10

    # A command line that cannot be carried out; its message is shown as is.
    class UsageError < StandardError; end

    # A profile that could not be downloaded; its message says why.
    class DownloadError < StandardError; end

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
      settings = { mode: "wall", interval: nil, raw: false, profile: DEFAULT_PROFILE, out: nil, limit: RUN_LIMIT,
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
        parser.on("--raw", "Keep the raw samples in the profile (for flame graphs)") { settings[:raw] = true }
        parser.on("--profile FILE", "Where to write the profile (default: #{DEFAULT_PROFILE} in the current directory)") do |file|
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
      if report&.match?(/\.json(\.gz)?\z/)
        raise UsageError, "run: -o FILE is where the text report goes; write the profile with --profile #{settings[:out]}"
      end

      begin
        # The profiler's own checks of the interval and of the profile's path.
        Options.new(mode: settings[:mode], interval: settings[:interval], native: settings[:native], out: profile)
      rescue ArgumentError => e
        raise UsageError, "run: #{e.message.sub(/\Aout path/, 'profile path')}"
      end
      check_report_path(report) if report
      if [LIB_DIR, profile].any? { |path| path.match?(/\s/) }
        raise UsageError, "cannot run with a space in Strobe's directory (#{LIB_DIR}) or in the profile path " \
                          "(#{profile}): RUBYOPT and the environment cannot carry it"
      end
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

    def keep_one(file, profile, quiet)
      File.rename(file, profile)
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
      @err.puts "strobe: report on one with: strobe report #{kept.first.last}"
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
        parser.separator "far on http://127.0.0.1:PORT/TOKEN/profile.json for the Firefox Profiler, and in Strobe's"
        parser.separator "own format on http://127.0.0.1:PORT/TOKEN/strobe.json for `strobe report URL`; the links"
        parser.separator "are printed on stderr. TOKEN is random: only who has a link can read the profile, and"
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
        parser.banner = "Usage: strobe report [options] FILE|URL..."
        parser.separator ""
        parser.separator "Reports on profiles written by Strobe (JSON, or gzipped JSON). Several files of the same"
        parser.separator "mode and interval are merged into one report. A FILE may be an http:// URL, such as the"
        parser.separator "strobe.json link `strobe serve` prints: it is downloaded (up to #{DOWNLOAD_LIMIT >> 20} MB), then read"
        parser.separator "as a file."
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
        parser.on("--thread ID|NAME", "Only the samples of thread ID (a key of the profile's threads), or of the " \
                                      "threads named NAME (main: the main thread; needs --raw)") do |thread|
          settings[:thread] = thread
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

    # Loads, merges and reports (to the file out, or else to stream);
    # returns the exit status.
    def print_report(paths, limit:, sort_by_total:, thread: nil, endpoint: nil, format: nil, format_arg: nil, filters: {},
                     node_fraction: 0.005, out: nil, stream: @out, marshal: false, walk: false)
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
        write_report(out, stream) do |io|
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

    # Yields stream (standard output), or a file written whole by AtomicFile
    # (as Strobe.save writes profiles: a failed report leaves no half file,
    # and no symlink is written through), returning the block's status; a
    # file that cannot be written is one error line. Errors writing the
    # stream (a closed pipe) are left to #run.
    def write_report(path, stream = @out)
      return yield(stream) unless path

      begin
        status = nil
        AtomicFile.write(path) { |file| status = yield(file) }
        status
      rescue SystemCallError => e
        error "cannot write #{path}: #{system_reason(e)}"
      end
    end

    # The profile in the file path, or downloaded from the URL path, checked;
    # nil once a failure is said in one line.
    def load_profile(path, marshal: false)
      return nil unless require_engine

      begin
        return download(path) { |file| read_profile(file, path, marshal) } if path.match?(URL)

        read_profile(path, path, marshal)
      rescue DownloadError => e
        error "cannot download #{path}: #{e.message}"
        nil
      rescue Strobe::ProfileError, SystemCallError, ArgumentError => e
        error "cannot read profile #{path}: #{load_failure_reason(e, path)}"
        nil
      end
    end

    # The profile in file, called name in messages (a downloaded one, its URL).
    def read_profile(file, name, marshal)
      @err.puts "strobe: warning: loading #{name} with Marshal, which can run code from the file" if marshal && marshal_file?(file)
      result = if file == name
                 Strobe.load(file, marshal: marshal)
               else
                 ProfileFile.parse(File.binread(file), name, marshal: marshal) # what Strobe.load does, named name
               end
      Report.new(result) # checks the shape
      result
    end

    # Downloads url into a temporary file and yields its path; the file is
    # removed after. At most DOWNLOAD_LIMIT bytes are taken (the most the
    # profile loader inflates a file to, ProfileFile::MAX_INFLATED), written
    # to the file as they come; the server has DOWNLOAD_TIMEOUT seconds to
    # accept the connection and for each read. Gzip is asked for and kept as
    # it came: the loader's checks of gzipped files apply to it.
    def download(url)
      require "net/http"
      require "tempfile"
      uri = begin
        URI.parse(url)
      rescue URI::InvalidURIError => e
        raise DownloadError, "not a valid URL (#{e.message})"
      end
      raise DownloadError, "only http:// URLs can be downloaded" if uri.is_a?(URI::HTTPS) || !uri.is_a?(URI::HTTP)
      raise DownloadError, "the URL names no host" if uri.host.to_s.empty?

      Tempfile.create("strobe-download") do |file|
        file.binmode
        fetch(uri, file)
        file.flush
        yield file.path
      end
    end

    def fetch(uri, file)
      Net::HTTP.start(uri.host, uri.port, open_timeout: DOWNLOAD_TIMEOUT, read_timeout: DOWNLOAD_TIMEOUT,
                                          write_timeout: DOWNLOAD_TIMEOUT) do |http|
        http.request(Net::HTTP::Get.new(uri, "Accept-Encoding" => "gzip")) do |response|
          raise DownloadError, "HTTP #{response.code} #{response.message}".strip unless response.code == "200"

          encoding = response["content-encoding"].to_s.strip.downcase
          unless ["", "identity", "gzip", "x-gzip"].include?(encoding)
            raise DownloadError, "the server sent it in #{encoding}, not gzip"
          end
          too_large = "larger than #{DOWNLOAD_LIMIT >> 20} MB, the most a profile may be"
          raise DownloadError, too_large if response["content-length"].to_i > DOWNLOAD_LIMIT

          size = 0
          response.read_body do |chunk|
            size += chunk.bytesize
            raise DownloadError, too_large if size > DOWNLOAD_LIMIT

            file.write(chunk)
          end
        end
      end
    rescue Timeout::Error # Net::OpenTimeout, Net::ReadTimeout
      raise DownloadError, "no answer within #{DOWNLOAD_TIMEOUT} s"
    rescue SystemCallError => e
      raise DownloadError, system_reason(e)
    rescue SocketError, IOError, Net::ProtocolError, Net::HTTPBadResponse => e
      raise DownloadError, e.message
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

    def report_options(parser, settings, default_limit: nil)
      default = default_limit ? "default #{default_limit}; 0: all" : "0: all, as stackprof"
      parser.on("-l", "--limit N", Integer, "Show only the first N frames (#{default})") do |n|
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

        Strobe is a sampling call-stack profiler for Ruby (the gem strobe-profiler:
        gem install strobe-profiler).

        Commands:
          run [options] [--] COMMAND...   Profile COMMAND (e.g. `ruby app.rb`), write the profile
                                          (default: #{DEFAULT_PROFILE}) and print its report on
                                          standard error (COMMAND's output stays its own)
          report [options] FILE|URL...    Report on saved (or served) profiles: text, files, method,
                                          graphviz, callgrind, stackcollapse, json, flamegraph, or
                                          exports for pprof, the Firefox Profiler and speedscope
          serve [options] [--] COMMAND... Profile COMMAND and serve the profile so far to the
                                          Firefox Profiler and to strobe report (links printed)
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
