# frozen_string_literal: true

# `strobe report`: its options and formats, and the report of the loaded
# (and merged) profiles, written to standard output or a file.

module Strobe
  class CLI
    # `strobe report [options] FILE|URL...` (included into CLI; `strobe run`
    # prints its report through print_report too).
    module ReportCommand
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

      def report_command(args)
        settings = { limit: nil, sort_by_total: false, thread: nil, endpoint: nil, format: nil, filters: {}, node_fraction: 0.005 }
        report_parser(settings).parse!(args)
        raise UsageError, "report: no FILE given (see strobe report --help)" if args.empty?

        print_report(args, **settings)
      end

      private

      def report_parser(settings)
        OptionParser.new do |parser|
          parser.banner = "Usage: strobe report [options] FILE|URL..."
          parser.separator ""
          parser.separator "Reports on profiles written by Strobe (JSON, or gzipped JSON). Several files of the same"
          parser.separator "mode and interval are merged into one report. A FILE may be an http:// URL, such as the"
          parser.separator "strobe.json link `strobe serve` prints: it is downloaded (up to #{Download::LIMIT >> 20} MB), then read"
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

        # Each file loaded as the merge reaches it, and let go once merged.
        results = paths.lazy.map { |path| load_profile(path, marshal: marshal) || throw(:unreadable) }
        begin
          result = catch(:unreadable) { Merge.results(results, paths.map { |path| shown_path(path) }) } || (return 1) # its one error line is printed
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
          error "cannot report on #{paths.map { |path| shown_path(path) }.join(', ')}: #{e.message}"
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
        when :dump then io.puts Marshal.dump(Strobe.expand(report.result))
        when :debug then PP.pp(Strobe.expand(report.result), io)
        else report.public_send("print_#{format}", io)
        end
        0
      end

      # Whether io is a pipe that nobody reads: what Ruby puts in place of a
      # standard output closed at start (`>&-`), where writes fail as they do
      # once `| head` has read enough (EPIPE), which ends the report quietly.
      # The writing end of a pipe shows as readable only then (select counts
      # the error).
      def unread_pipe?(io)
        io.is_a?(IO) && io.stat.pipe? && !IO.select([io], nil, nil, 0).nil?
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
      # file or stream that cannot be written (a full disk, a closed standard
      # output) is one error line. The stream is flushed before the status
      # is returned: what stays buffered would fail unseen at exit. A closed
      # pipe (`| head`) is left to #run, which ends quietly.
      def write_report(path, stream = @out)
        unless path
          return error("cannot write the report: nothing reads standard output (it is closed)") if unread_pipe?(stream)

          status = yield(stream)
          stream.flush if stream.respond_to?(:flush)
          return status
        end

        begin
          status = nil
          AtomicFile.write(path) { |file| status = yield(file) }
          status
        rescue SystemCallError => e
          error "cannot write #{path}: #{system_reason(e)}"
        end
      rescue Errno::EPIPE
        raise
      rescue SystemCallError, IOError => e
        error "cannot write the report: #{system_reason(e)}"
      end
    end
  end
end
