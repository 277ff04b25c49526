# frozen_string_literal: true

# Strobe::Report: the reports of a result, its filters and its counts.
# Printable text, the thread and endpoint parts, source paths, the header,
# the trace reports and the method report are in report/.

require_relative "report_source"
require_relative "profile_file"

module Strobe
  # Reports on a result Hash (stackprof 0.2.27's shape, as returned by
  # Strobe.run or Strobe.load):
  #
  #   report = Strobe::Report.new(result)
  #   report.print_text($stdout, limit: 20)
  #   report.print_method($stdout, "Foo#bar")
  #   report.print_flamegraph(File.open("flame.html", "w"))
  #
  # Work that grows with the frames or the samples (sorting and formatting
  # rows, walking the raw stacks, call graphs) is done in C
  # (Strobe::Native.report_*); this class prepares the filters and prints
  # what is small.
  #
  # Filters, as stackprof's: select_files/reject_files keep or drop frames
  # whose file starts with one of the given paths (expanded);
  # select_names/reject_names keep or drop frames whose name matches one of
  # the given Regexps (or Strings, matched as substrings). A dropped frame is
  # left out of every report. Reports built from the samples' stacks
  # (stackcollapse, flamegraph, files) give its samples to its nearest kept
  # caller; the tables built from each frame's own counts (text, method,
  # Graphviz, callgrind) just leave its row out.
  class Report
    # Its parts, which reopen it: required once it is defined, as with
    # strobe.rb's autoload of Report set, a part opening it first would
    # load this file again.
    require_relative "report/printable"
    require_relative "report/parts"
    require_relative "report/source_files"
    require_relative "report/header"
    require_relative "report/trace_report"
    require_relative "report/method_report"

    extend Printable
    extend Parts
    include MethodReport

    # One line of the table: a frame with its total (inclusive) and self
    # sample counts.
    Row = Struct.new(:id, :name, :file, :line, :total, :self_samples, keyword_init: true)

    RULE = "=================================="
    HEADER_FORMAT = "%10s    (pct)  %10s    (pct)     FRAME\n"
    FILTERS = %i[select_files reject_files select_names reject_names].freeze

    # thread: a thread id (a key of result[:threads]) or name (see
    # thread_ids) restricts the report to the samples of that thread, or of
    # the threads of that name; endpoint: a request endpoint (the
    # middleware's request markers: "PostsController#index", or
    # "GET /posts") to the samples of the threads serving those requests
    # while they did. Both need the per-sample data of raw: true.
    def initialize(result, thread: nil, endpoint: nil, **filters)
      unless result.is_a?(Hash) && (result[:frames].nil? || result[:frames].is_a?(Hash))
        raise ArgumentError, "not a Strobe result: expected a Hash with a :frames Hash, got #{result.class}"
      end
      unknown = filters.keys - FILTERS
      raise ArgumentError, "unknown option#{'s' if unknown.size > 1}: #{unknown.map(&:inspect).join(', ')}" unless unknown.empty?

      @result = thread.nil? ? result : self.class.thread_result(result, thread)
      @selected = thread
      @result = self.class.endpoint_result(@result, endpoint) unless endpoint.nil?
      @result = @result.merge(frames: {}) if @result[:frames].nil?
      @filters = filters.transform_values { |v| Array(v) }.reject { |_, v| v.empty? }
    end

    attr_reader :result

    # The mode as a String ("wall", "cpu", ...): a Symbol in a fresh result,
    # possibly a String in one read back from JSON.
    def mode
      @result[:mode].to_s
    end

    def interval
      @result[:interval]
    end

    # All samples, GC samples included.
    def samples
      count_of(:samples)
    end

    def gc_samples
      count_of(:gc_samples)
    end

    def missed_samples
      count_of(:missed_samples)
    end

    # Samples whose stack was deeper than 1024 frames (cut to the innermost).
    def truncated_samples
      count_of(:truncated_samples)
    end

    # Percentage of the samples due that were missed, 0.0 when none were due.
    def miss_rate
      due = samples + missed_samples
      due.zero? ? 0.0 : 100.0 * missed_samples / due
    end

    # Percentage of the samples taken during garbage collection.
    def gc_rate
      percent(gc_samples)
    end

    # Percentage of all samples that count represents (0.0 without samples).
    def percent(count)
      samples.zero? ? 0.0 : 100.0 * count / samples
    end

    # The kept frames as Rows, sorted by self samples (or by total samples
    # with sort_by_total), most first; ties by name, then id, so the output
    # is the same from run to run. limit keeps the first rows.
    def rows(limit: nil, sort_by_total: false)
      check_limit(limit)
      all = frames.map do |id, frame|
        Row.new(id: id, name: frame[:name].to_s, file: frame[:file].to_s, line: frame[:line],
                total: frame[:total_samples].to_i, self_samples: frame[:samples].to_i)
      end
      sorted = all.sort_by { |row| [-(sort_by_total ? row.total : row.self_samples), row.name, row.id] }
      limit ? sorted.first(limit) : sorted
    end

    # Whether the result is a trace (mode :trace): exact calls and times
    # rather than samples.
    def trace?
      mode == "trace"
    end

    # Prints the header and the frame table in stackprof's text layout; for
    # a trace, calls, total and self time per method.
    def print_text(io = $stdout, limit: nil, sort_by_total: false)
      check_limit(limit)
      return print_trace_text(io, limit: limit, sort_by_total: sort_by_total) if trace?

      Header.new(self, @selected).print(io)
      if samples.zero?
        io.puts "  No samples were collected."
        return
      end

      io.printf(HEADER_FORMAT, "TOTAL", "SAMPLES")
      io.write(Native.report_text(@result, kept_ids, sort_by_total, limit))
    end

    # A trace's reports (see TraceReport): the table of calls, total and
    # self time per method, those per file, the call graph and callgrind.
    def print_trace_text(io, limit:, sort_by_total:)
      trace_report.print_text(io, limit: limit, sort_by_total: sort_by_total)
    end

    def print_trace_files(io, limit:)
      trace_report.print_files(io, limit: limit)
    end

    def print_trace_graphviz(io, limit: nil)
      trace_report.print_graphviz(io, limit: limit)
    end

    def print_trace_callgrind(io)
      trace_report.print_callgrind(io)
    end

    # The time the trace covers: the self times of every method add up to it.
    def trace_wall_time
      trace_report.wall_time
    end

    # seconds as a share of total: "(12.5%)".
    def time_pct(seconds, total)
      trace_report.time_pct(seconds, total)
    end

    # A name inside a DOT string: made printable, then quotes and
    # backslashes escaped (as ext/strobe/out.c writes frame names there).
    def dot_escape(name)
      Report.printable(name).gsub(/["\\]/) { |c| "\\#{c}" }
    end

    FILES_HEADER = "%10s    (pct)  %10s    (pct)     FILE\n"

    # Samples per source file, most self samples first: total counts the
    # samples with one of the file's frames anywhere on the stack (once per
    # sample), self those with one on top. Without raw data only self is
    # known (total is shown as "-"). A file is named by its absolute path
    # (see source_file).
    def print_files(io = $stdout, limit: nil, sort_by_total: false)
      check_limit(limit)
      return print_trace_files(io, limit: limit) if trace?

      list = if Stacks.samples?(@result)
               Native.report_files(source_files.resolve_frames(@result), kept_ids)
             else
               frames.values.group_by { |f| source_file(f) }.map { |file, fs| [file, nil, fs.sum { |f| f[:samples].to_i }] }
             end
      list = list.sort_by { |file, total, self_count| [-(sort_by_total ? total.to_i : self_count), file] }
      list = list.first(limit) if limit
      io.printf(FILES_HEADER, "TOTAL", "SAMPLES")
      list.each do |file, total, self_count|
        total_columns = total ? format("%10d %8s", total, format_percent(total)) : format("%10s %8s", "-", "")
        io.printf("%s  %10d %8s     %s\n", total_columns, self_count, format_percent(self_count),
                  file.empty? ? "(no file)" : shown(file))
      end
    end

    # The source of every file whose path ends with path (or, when none
    # does, contains it, as stackprof's --file), annotated with the samples
    # of each line.
    def print_file(io = $stdout, path)
      files = frames.values.map { |f| source_file(f) }.uniq
      matches = files.select { |file| file == path || file.end_with?("/#{path}") }
      matches = files.select { |file| file.include?(path) } if matches.empty? && !path.empty?
      raise ArgumentError, "no samples in a file matching #{shown(path)}" if matches.empty?

      matches.sort.each do |file|
        lines = Hash.new { |h, k| h[k] = [0, 0] }
        frames.each_value do |frame|
          next unless source_file(frame) == file

          lines_of(frame).each do |line, (total, self_count)|
            lines[line][0] += total.to_i
            lines[line][1] += self_count.to_i
          end
        end
        io.puts shown(file)
        ReportSource.new(file, lines, self).print(PrintableLines.new(io), 1..)
      end
    end

    # A Graphviz (DOT) call graph: frames with at least node_fraction of all
    # samples in total; render with `dot -Tsvg`. limit keeps the limit
    # frames with the most total samples; only (frame ids) draws just those.
    def print_graphviz(io = $stdout, node_fraction: 0.005, limit: nil, only: nil)
      return print_trace_graphviz(io, limit: limit) if trace?

      unless node_fraction.is_a?(Numeric) && node_fraction >= 0 && node_fraction <= 1
        raise ArgumentError, "node_fraction must be a number from 0 to 1, got #{node_fraction.inspect}"
      end

      check_limit(limit)
      keep = kept_ids
      keep = (keep || frames).select { |id, _| only.include?(id) }.transform_values { true } if only
      keep = rows(limit: limit, sort_by_total: true).select { |row| keep.nil? || keep.key?(row.id) }.to_h { |row| [row.id, true] } if limit
      io.write(Native.report_graphviz(@result, keep, node_fraction.to_f))
    end

    # SamplingProf's text format (see Strobe::SamplingProf); needs raw data.
    def print_sampling_prof(io = $stdout)
      Report.refuse_trace(@result, "the SamplingProf format")
      require_relative "sampling_prof"
      SamplingProf.write(@result, io)
    end

    # The callgrind format, for KCachegrind and callgrind_annotate.
    def print_callgrind(io = $stdout)
      return print_trace_callgrind(io) if trace?

      io.write(Native.report_callgrind(@result, kept_ids))
    end

    # A name on a callgrind line, which it ends: printable, ';' as ':' (as
    # ext/strobe/report.c writes callgrind and folded stacks).
    def callgrind_name(name)
      Report.printable(name).tr(";", ":")
    end

    # Folded stacks ("root;...;leaf count" a line) for flamegraph.pl,
    # inferno or speedscope; needs raw data. Handed to io in chunks as they
    # are written: deep stacks make far more of them than the profile holds.
    def print_stackcollapse(io = $stdout)
      Report.refuse_trace(@result, "the folded stacks format")
      Native.report_folded(@result, kept_ids, io)
    end

    # pprof's profile.proto, gzipped, for `go tool pprof` (or Pyroscope,
    # Grafana): a sample per distinct stack and thread, with its count and
    # time (or allocations), labelled with its thread. Needs raw data.
    def print_pprof(io = $stdout)
      Report.refuse_trace(@result, "pprof output")
      require "zlib"
      Zlib::GzipWriter.wrap(ProfileFile::KeepOpen.new(io), ProfileFile::PPROF_GZIP_LEVEL) do |gz|
        Native.export_pprof(@result, kept_ids, gz)
      end
      io
    end

    # The Firefox Profiler's processed-profile JSON: a track per thread,
    # samples at their times, GC in a category of its own. Needs raw data.
    def print_firefox(io = $stdout)
      Report.refuse_trace(@result, "Firefox Profiler output")
      Native.export_firefox(@result, kept_ids, io)
    end

    # speedscope's JSON file format: a sampled profile per thread, in time
    # order. Needs raw data.
    def print_speedscope(io = $stdout)
      Report.refuse_trace(@result, "speedscope output")
      Native.export_speedscope(@result, kept_ids, io)
    end

    # The result as JSON, in stackprof's layout (what `stackprof --json`
    # writes): with the raw arrays stackprof's tools read, built here.
    def print_json(io = $stdout)
      require "json"
      io.puts JSON.generate(Strobe.expand(@result), max_nesting: false)
    end

    # A self-contained HTML flamegraph (no network access needed): zoom,
    # search, tooltips, and a timeline view besides the aggregated one;
    # view (:aggregated or :timeline) is the one it opens with. Needs raw
    # data.
    def print_flamegraph(io = $stdout, title: nil, view: :aggregated)
      require_relative "flamegraph"
      Flamegraph.new(self, title: title, view: view).write(io)
    end

    # The stack tree of the raw samples, after the filters (see
    # Native.report_tree).
    def stack_tree
      Report.refuse_trace(@result, "this report")
      Native.report_tree(@result, kept_ids)
    end

    # The stack tree and the threads' lanes of the HTML flamegraph, after
    # the filters (see Native.flamegraph_data, ext/strobe/flamegraph.c).
    def flamegraph_data
      Report.refuse_trace(@result, "a flamegraph")
      Native.flamegraph_data(@result, kept_ids)
    end

    def frames
      all = @result[:frames] || {}
      keep = kept_ids
      keep ? all.select { |id, _| keep.key?(id) } : all
    end

    def format_percent(count)
      format("(%2.1f%%)", percent(count))
    end

    # The path of a frame's source file: a relative one (`ruby app.rb`
    # makes Ruby name app.rb's top frame "app.rb", its methods' frames
    # "/dir/app.rb") resolved, so that a file is one file in the reports.
    def source_file(frame)
      source_files.path(frame)
    end

    # Paths that name a source file relative to a directory: not absolute,
    # and not one of Ruby's names for code without a file ("-e", "(eval)",
    # "<internal:kernel>", "<cfunc>").
    def self.relative_path?(file)
      SourceFiles.relative_path?(file)
    end

    private

    def count_of(key)
      ProfileFile.count(@result[key], key.to_s)
    end

    def check_limit(limit)
      return if limit.nil? || (limit.is_a?(Integer) && limit >= 0)

      raise ArgumentError, "limit must be a non-negative Integer, got #{limit.inspect}"
    end

    # nil (every frame), or a Hash of the ids of the frames the filters keep.
    def kept_ids
      return nil if @filters.empty?

      @kept_ids ||= (@result[:frames] || {}).each_with_object({}) do |(id, frame), keep|
        keep[id] = true if kept?(frame)
      end
    end

    def kept?(frame)
      file = source_file(frame)
      name = frame[:name].to_s
      prefixes = ->(key) { @filters[key].map { |path| File.expand_path(path) } }
      patterns = ->(key) { @filters[key].map { |p| p.is_a?(Regexp) ? p : Regexp.new(Regexp.escape(p.to_s)) } }
      return false if @filters[:select_files] && prefixes.(:select_files).none? { |path| file.start_with?(path) }
      return false if @filters[:reject_files] && prefixes.(:reject_files).any? { |path| file.start_with?(path) }
      return false if @filters[:select_names] && patterns.(:select_names).none? { |re| re.match?(name) }
      return false if @filters[:reject_names] && patterns.(:reject_names).any? { |re| re.match?(name) }

      true
    end

    def source_files
      @source_files ||= SourceFiles.new(@result)
    end

    def trace_report
      @trace_report ||= TraceReport.new(self)
    end

    # A frame's {line => [total, self]}, checked.
    def lines_of(frame)
      lines = frame[:lines] || {}
      return lines if lines.is_a?(Hash) && lines.all? { |n, pair| n.is_a?(Integer) && pair.is_a?(Array) && pair.all?(Integer) }

      raise ProfileError, "malformed profile: the lines of #{shown(frame[:name])} are not {line => [total, self]}"
    end

    def shown(text)
      Report.printable(text)
    end
  end
end
