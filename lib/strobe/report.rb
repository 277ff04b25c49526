# frozen_string_literal: true

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
    # One line of the table: a frame with its total (inclusive) and self
    # sample counts.
    Row = Struct.new(:id, :name, :file, :line, :total, :self_samples, keyword_init: true)

    RULE = "=================================="
    HEADER_FORMAT = "%10s    (pct)  %10s    (pct)     FRAME\n"
    FILTERS = %i[select_files reject_files select_names reject_names].freeze

    # Characters a terminal may act on rather than show: C0 controls, DEL
    # and C1 controls (U+0080 to U+009F).
    CONTROL = /[\x00-\x1f\x7f\u0080-\u009f]/
    CONTROL_BUT_TAB = /[\x00-\x08\x0a-\x1f\x7f\u0080-\u009f]/
    NAMED_ESCAPES = { "\e" => "\\e", "\n" => "\\n", "\r" => "\\r", "\t" => "\\t" }.freeze

    # text (a frame, file or thread name, a message quoting one) as it is
    # safe to show on a terminal, in UTF-8: ESC, newline, carriage return
    # and tab as \e \n \r \t, other C0 controls and DEL as \xNN, C1
    # controls as \uNNNN, and bytes that are not UTF-8 as \xNN (the notation
    # of Ruby's String#inspect; backslashes themselves are left as they are).
    # Text in another encoding is converted to UTF-8 first. Every text
    # report writes names through this (ext/strobe/out.c has the same rules
    # in C, for the reports written there). keep_tabs: leaves tabs as they
    # are (for source code).
    def self.printable(text, keep_tabs: false)
      control = keep_tabs ? CONTROL_BUT_TAB : CONTROL
      str = utf8_text(text.to_s)
      return str if str.valid_encoding? && !str.match?(control)

      str.scrub { |bytes| bytes.unpack("C*").map { |byte| format("\\x%02X", byte) }.join }.gsub(control) do |c|
        NAMED_ESCAPES[c] || format(c.ord < 0x80 ? "\\x%02X" : "\\u%04X", c.ord)
      end
    end

    # str's text in UTF-8: str itself; a String in US-ASCII or binary with
    # its bytes taken for UTF-8; another encoding converted, or its bytes
    # taken for UTF-8 where it cannot be.
    def self.utf8_text(str)
      return str if str.encoding == Encoding::UTF_8
      return str.dup.force_encoding(Encoding::UTF_8) if [Encoding::US_ASCII, Encoding::BINARY].include?(str.encoding)

      str.encode(Encoding::UTF_8)
    rescue EncodingError
      str.b.force_encoding(Encoding::UTF_8)
    end
    private_class_method :utf8_text

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

    # The result of one thread, or of the threads sharing a name (see
    # thread_ids), derived (in C) from a result with raw data.
    def self.thread_result(result, thread)
      ids = thread_ids(result, thread)
      unless result[:raw].is_a?(Array) && result[:raw_sample_threads].is_a?(Array)
        raise ArgumentError, "a report for one thread needs per-sample data: profile with raw: true (strobe run --raw)"
      end
      return Native.thread_subset(result, ids.first) if ids.size == 1

      Native.windows_subset(result, ids.map { |id| [id, nil, nil] }) # every sample of each
    end

    # The ids of the threads thread stands for: thread itself when it is a
    # key of result[:threads]; for a String, the id it spells when that is a
    # key, or else every thread it names ("main" also names the main
    # thread). Raises ArgumentError listing the threads when there is none.
    def self.thread_ids(result, thread)
      threads = result[:threads].is_a?(Hash) ? result[:threads] : {}
      return [thread] if threads.key?(thread)

      number = thread.to_s.match?(/\A-?\d+\z/)
      if thread.is_a?(String)
        return [thread.to_i] if number && threads.key?(thread.to_i)

        named = threads.select { |_, info| info.is_a?(Hash) && (info[:name] == thread || (thread == "main" && info[:main])) }
        return named.keys unless named.empty?
      end
      known = threads.map { |id, info| (name = thread_name(info)) ? "#{name} (#{id})" : id.to_s }
      raise ArgumentError, printable("no thread #{number ? thread : thread.inspect} in this profile " \
                                     "(threads: #{known.empty? ? 'none' : known.join(', ')})")
    end

    # A thread's name as reports show it: its own, or "main" for the main
    # thread when it has none; nil for another thread without one.
    def self.thread_name(info)
      return nil unless info.is_a?(Hash)

      info[:name] || ("main" if info[:main])
    end

    # The samples a result's threads took while serving requests to
    # endpoint (derived in C from raw data and the request markers).
    def self.endpoint_result(result, endpoint)
      requests = Array(result[:markers]).select do |m|
        m.is_a?(Hash) && m[:type].to_s == "request" && m[:start].is_a?(Integer) && m[:end].is_a?(Integer)
      end
      endpoints = requests.map { |m| request_endpoint(m) }
      windows = requests.zip(endpoints).filter_map { |m, e| [m[:thread], m[:start], m[:end]] if e == endpoint }
      if windows.empty?
        known = endpoints.tally.sort_by { |e, n| [-n, e.to_s] }.first(10).map(&:first)
        known = known.empty? ? "none: it was not profiled by Strobe::Middleware" : known.join(", ")
        raise ArgumentError, printable("no request to endpoint #{endpoint.inspect} in this profile (endpoints: #{known})")
      end
      unless result[:raw].is_a?(Array) && result[:raw_sample_threads].is_a?(Array) && result[:raw_sample_timestamps].is_a?(Array)
        raise ArgumentError, "a report for one endpoint needs per-sample data: profile with raw: true (strobe run --raw)"
      end

      Native.windows_subset(result, windows)
    end

    # A request marker's endpoint, as pprof's endpoint label has it.
    def self.request_endpoint(marker)
      data = marker[:data]
      endpoint = data[:endpoint] if data.is_a?(Hash)
      endpoint.is_a?(String) ? endpoint : marker[:name]
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

      print_header(io)
      if samples.zero?
        io.puts "  No samples were collected."
        return
      end

      io.printf(HEADER_FORMAT, "TOTAL", "SAMPLES")
      io.write(Native.report_text(@result, kept_ids, sort_by_total, limit))
    end

    TRACE_HEADER = "%10s  %12s    (pct)  %12s    (pct)     METHOD\n"

    # A trace's table: calls, total time (the method and its callees,
    # recursion counted once) and self time, in milliseconds, most self
    # time first (or total with sort_by_total).
    def print_trace_text(io, limit:, sort_by_total:)
      rows = frames.map { |id, f| [id, f] }.sort_by do |id, f|
        [-(sort_by_total ? f[:total_time] : f[:self_time]).to_f, f[:name].to_s, id]
      end
      rows = rows.first(limit) if limit
      total = rows.empty? ? 0.0 : trace_wall_time
      io.puts RULE
      io.puts "  Mode: trace(#{shown(@result[:clock] || 'wall')})"
      io.puts format("  Calls: %d", count_of(:samples))
      io.puts format("  Time: %.3f ms", total * 1000)
      io.puts RULE
      io.printf(TRACE_HEADER, "CALLS", "TOTAL ms", "SELF ms")
      rows.each do |_, f|
        io.printf("%10d  %12.3f %8s  %12.3f %8s     %s\n", f[:calls].to_i, f[:total_time].to_f * 1000,
                  time_pct(f[:total_time], total), f[:self_time].to_f * 1000, time_pct(f[:self_time], total),
                  shown(f[:name]))
      end
    end

    # The time the trace covers: the self times of every method add up to it.
    def trace_wall_time
      frames.values.sum { |f| f[:self_time].to_f }
    end

    def time_pct(seconds, total)
      format("(%.1f%%)", total.positive? ? 100.0 * seconds.to_f / total : 0.0)
    end

    # A trace's call graph: each method with its calls, total and self time,
    # each edge with its calls.
    def print_trace_graphviz(io, limit: nil)
      kept = frames.sort_by { |id, f| [-f[:total_time].to_f, id] }
      kept = kept.first(limit) if limit
      ids = kept.to_h { |id, _| [id, true] }
      total = trace_wall_time
      io.puts "digraph profile {"
      io.puts '  node [shape=box, fontsize=10];'
      kept.each do |id, f|
        label = format("%s\\n%d calls\\ntotal %.3f ms %s\\nself %.3f ms %s", dot_escape(f[:name]), f[:calls].to_i,
                       f[:total_time].to_f * 1000, time_pct(f[:total_time], total), f[:self_time].to_f * 1000,
                       time_pct(f[:self_time], total))
        io.puts "  f#{id} [label=\"#{label}\"];"
      end
      kept.each do |id, f|
        (f[:edges] || {}).each do |callee, calls|
          next unless ids[callee]

          io.puts "  f#{id} -> f#{callee} [label=\"#{calls} calls\"];"
        end
      end
      io.puts "}"
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

      list = if @result[:raw].is_a?(Array)
               Native.report_files(with_source_files(@result), kept_ids)
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

    # A method's callers and callees with counts and percentages, and its
    # source annotated line by line, for every frame whose name equals name
    # (or, when none does, contains it, as stackprof's --method), or
    # matches it, for a Regexp.
    def print_method(io = $stdout, name)
      matches = method_matches(name)
      raise ArgumentError, "no method named #{shown(name.inspect)} in this profile" if matches.empty?

      all = @result[:frames]
      matches.sort_by { |id, _| [-all[id][:total_samples].to_i, all[id][:name].to_s, id] }.each do |id, callers|
        print_method_frame(io, id, all[id], callers)
      end
    end

    # print_method, then a numbered list of the callers and callees to go to
    # next, read from input, until "exit", a blank line or the end of input;
    # what `strobe report --method NAME --walk` does.
    def walk_method(input, io, name)
      loop do
        print_method(io, name)
        choices = neighbour_names(name) + [:exit]
        io.puts
        io.puts "Select next method:"
        choices.each_with_index { |choice, i| io.printf("%3d)  %s\n", i + 1, shown(choice)) }
        choice = read_choice(input, io, choices)
        return if choice.nil? || choice == :exit

        name = choice
        io.puts
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
      require_relative "sampling_prof"
      SamplingProf.write(@result, io)
    end

    # The callgrind format, for KCachegrind and callgrind_annotate.
    def print_callgrind(io = $stdout)
      return print_trace_callgrind(io) if trace?

      io.write(Native.report_callgrind(@result, kept_ids))
    end

    # A trace per source file: calls and self time of its methods.
    def print_trace_files(io, limit:)
      by_file = frames.values.group_by { |f| source_file(f) }.map do |file, fs|
        [file, fs.sum { |f| f[:calls].to_i }, fs.sum { |f| f[:self_time].to_f }]
      end
      by_file = by_file.sort_by { |file, _, self_time| [-self_time, file] }
      by_file = by_file.first(limit) if limit
      total = trace_wall_time
      io.printf("%10s  %12s    (pct)     FILE\n", "CALLS", "SELF ms")
      by_file.each do |file, calls, self_time|
        io.printf("%10d  %12.3f %8s     %s\n", calls, self_time * 1000, time_pct(self_time, total), shown(file))
      end
    end

    # A trace in the callgrind format: microseconds, each function's own
    # cost and, per call edge, its calls and the time spent in them.
    def print_trace_callgrind(io)
      kept = frames
      micros = ->(seconds) { (seconds.to_f * 1e6).round }
      io.puts "# callgrind format", "version: 1", "creator: strobe", "positions: line", "events: Microseconds"
      io.puts "summary: #{micros.(trace_wall_time)}"
      kept.each do |id, f|
        io.puts "", "fl=#{callgrind_name(f[:file])}", "fn=#{callgrind_name(f[:name])}"
        line = f[:line].to_i
        io.puts "#{line} #{micros.(f[:self_time])}"
        (f[:edges] || {}).each do |callee, calls|
          target = kept[callee] or next
          io.puts "cfl=#{callgrind_name(target[:file])}", "cfn=#{callgrind_name(target[:name])}",
                  "calls=#{calls} #{target[:line].to_i}"
          io.puts "#{line} #{micros.((f[:call_times] || {})[callee])}"
        end
      end
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
      Native.report_folded(@result, kept_ids, io)
    end

    # pprof's profile.proto, gzipped, for `go tool pprof` (or Pyroscope,
    # Grafana): a sample per distinct stack and thread, with its count and
    # time (or allocations), labelled with its thread. Needs raw data.
    def print_pprof(io = $stdout)
      require "zlib"
      Zlib::GzipWriter.wrap(ProfileFile::KeepOpen.new(io)) { |gz| Native.export_pprof(@result, kept_ids, gz) }
      io
    end

    # The Firefox Profiler's processed-profile JSON: a track per thread,
    # samples at their times, GC in a category of its own. Needs raw data.
    def print_firefox(io = $stdout)
      Native.export_firefox(@result, kept_ids, io)
    end

    # speedscope's JSON file format: a sampled profile per thread, in time
    # order. Needs raw data.
    def print_speedscope(io = $stdout)
      Native.export_speedscope(@result, kept_ids, io)
    end

    # The result as JSON, in stackprof's layout (what `stackprof --json`
    # writes).
    def print_json(io = $stdout)
      require "json"
      io.puts JSON.generate(@result, max_nesting: false)
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
      Native.report_tree(@result, kept_ids)
    end

    # The stack tree and the threads' lanes of the HTML flamegraph, after
    # the filters (see Native.flamegraph_data, ext/strobe/flamegraph.c).
    def flamegraph_data
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
      file = frame[:file].to_s
      frame[:native] ? file : resolved_files.fetch(file, file)
    end

    # Paths that name a source file relative to a directory: not absolute,
    # and not one of Ruby's names for code without a file ("-e", "(eval)",
    # "<internal:kernel>", "<cfunc>").
    def self.relative_path?(file)
      !file.empty? && !file.start_with?("/", "<", "(", "~") && !%w[- -e].include?(file) && !file.include?("\0")
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

    # {relative path => absolute path} for the relative paths of the
    # profile's source files: resolved against the directory the profile
    # was taken in (result[:cwd]) or, for a profile without it, taken for
    # the one absolute path of the profile that ends with "/" and the
    # path, when exactly one does.
    def resolved_files
      @resolved_files ||= begin
        files = (@result[:frames] || {}).each_value.filter_map do |f|
          f[:file] if f.is_a?(Hash) && f[:file].is_a?(String) && !f[:native]
        end.uniq
        relative = files.select { |file| Report.relative_path?(file) }
        relative.empty? ? {} : resolve(relative, files)
      end
    end

    def resolve(relative, files)
      cwd = @result[:cwd]
      if cwd.is_a?(String) && cwd.start_with?("/")
        return relative.to_h { |file| [file, File.expand_path(file, cwd)] }
      end

      absolute = files.select { |file| file.start_with?("/") }.group_by { |file| File.basename(file) }
      relative.each_with_object({}) do |file, map|
        suffix = "/#{file.sub(%r{\A(\./)+}, '')}"
        candidates = (absolute[File.basename(file)] || []).select { |path| path.end_with?(suffix) }
        map[file] = candidates.first if candidates.size == 1
      end
    rescue ArgumentError, EncodingError
      {} # a path File will not take (a byte that is not in its encoding)
    end

    # result with its frames' files resolved (source_file), for the C
    # reports that count by file.
    def with_source_files(result)
      return result if resolved_files.empty?

      result.merge(frames: result[:frames].transform_values do |f|
        f.is_a?(Hash) && !f[:native] && resolved_files.key?(f[:file]) ? f.merge(file: resolved_files[f[:file]]) : f
      end)
    end

    def print_method_frame(io, id, frame, callers)
      total = frame[:total_samples].to_i
      self_count = frame[:samples].to_i
      file = source_file(frame)
      location = frame[:line] ? "#{file}:#{frame[:line]}" : file
      io.puts shown("#{frame[:name]} (#{location})")
      if trace?
        all = trace_wall_time
        io.printf("  calls: %d, self: %.3f ms %s / total: %.3f ms %s\n", frame[:calls].to_i, frame[:self_time].to_f * 1000,
                  time_pct(frame[:self_time], all), frame[:total_time].to_f * 1000, time_pct(frame[:total_time], all))
      else
        io.printf("  samples: %6d self %8s  / %6d total %8s\n", self_count, format_percent(self_count), total,
                  format_percent(total))
      end
      print_neighbours(io, trace? ? "callers (calls)" : "callers", callers)
      print_neighbours(io, trace? ? "callees (calls)" : "callees", frame[:edges] || {})
      lines = lines_of(frame)
      return if lines.empty? || file.empty?

      io.puts "  code:"
      first = frame[:line].is_a?(Integer) ? frame[:line] : lines.keys.min
      ReportSource.new(file, lines, self).print(PrintableLines.new(io), first..lines.keys.max, indent: "  ")
    end

    # [[id, {caller id => count}], ...] of the frames name stands for (see
    # print_method).
    def method_matches(name)
      matches = Native.report_method(@result, kept_ids, name)
      return matches unless matches.empty? && name.is_a?(String) && !name.empty?

      Native.report_method(@result, kept_ids, Regexp.new(Regexp.escape(name)))
    end

    # The names of the callers (most samples first), then of the callees, of
    # the frames print_method shows for name.
    def neighbour_names(name)
      all = @result[:frames]
      method_matches(name).flat_map do |id, callers|
        callees = (all[id][:edges] || {}).select { |callee, _| all.key?(callee) }
        [callers, callees].flat_map { |counts| counts.sort_by { |other, count| [-count.to_i, all[other][:name].to_s] } }
                          .map { |other, _| all[other][:name].to_s }
      end.uniq
    end

    # A number from input naming one of choices (asked again until it does);
    # nil at the end of input or on a blank line.
    def read_choice(input, io, choices)
      loop do
        io.print "> "
        io.flush if io.respond_to?(:flush)
        line = input.gets
        return nil if line.nil? || line.strip.empty?

        index = Integer(line.strip, exception: false)
        return choices[index - 1] if index&.between?(1, choices.size)

        io.puts "Not a choice: #{shown(line.strip)} (1 to #{choices.size}; a blank line or #{choices.size} exits)"
      end
    end

    # A frame's {line => [total, self]}, checked.
    def lines_of(frame)
      lines = frame[:lines] || {}
      return lines if lines.is_a?(Hash) && lines.all? { |n, pair| n.is_a?(Integer) && pair.is_a?(Array) && pair.all?(Integer) }

      raise ProfileError, "malformed profile: the lines of #{shown(frame[:name])} are not {line => [total, self]}"
    end

    def print_neighbours(io, label, counts)
      all = @result[:frames] || {}
      shown = counts.select { |id, _| all.key?(id) && (kept_ids.nil? || kept_ids.key?(id)) }
      return if shown.empty?
      unless shown.values.all? { |count| count.is_a?(Integer) && count >= 0 }
        raise ProfileError, "malformed profile: an edge count is not a non-negative integer"
      end

      sum = shown.values.sum
      io.puts "  #{label} (#{sum} total):"
      shown.sort_by { |id, count| [-count, all[id][:name].to_s] }.each do |id, count|
        io.printf("    %6d  (%5.1f%%)  %s\n", count, sum.zero? ? 0.0 : 100.0 * count / sum, shown(all[id][:name]))
      end
    end

    def print_header(io)
      io.puts RULE
      io.puts "  Mode: #{shown(modeline)}"
      io.puts "  Thread: #{shown(thread_line)}" if @result[:thread] || @selected
      io.puts format("  Samples: %d (%.2f%% miss rate)", samples, miss_rate)
      io.puts format("  GC: %d (%.2f%%)", gc_samples, gc_rate)
      if truncated_samples.positive?
        io.puts format("  Truncated: %d (%.2f%%), stacks deeper than 1024 frames", truncated_samples,
                       percent(truncated_samples))
      end
      print_threads(io)
      io.puts RULE
    end

    THREAD_HEADER = "    %10s  %10s    (pct)"
    THREAD_ROW = "    %10s  %10d %8s"
    STATE_COLUMNS = "  %7s  %7s  %7s"

    # The threads, most samples first, when there are several or their
    # samples carry GVL states (Ruby 3.2+): each one's id, samples and share
    # of the report's samples, the share of its own samples it was running,
    # waiting for the GVL or blocked, and its name.
    def print_threads(io)
      threads = @result[:threads].is_a?(Hash) ? @result[:threads].select { |_, t| t.is_a?(Hash) } : {}
      states = threads.values.any? { |t| t[:states].is_a?(Hash) }
      return unless threads.size > 1 || states

      io.puts states ? "  Threads (RUNNING / WAITING for the GVL / BLOCKED: shares of each one's samples):" : "  Threads:"
      io.puts [format(THREAD_HEADER, "ID", "SAMPLES"), (format(STATE_COLUMNS, "RUNNING", "WAITING", "BLOCKED") if states),
               "     THREAD"].join
      threads.sort_by { |id, t| [-t[:samples].to_i, id.to_s] }.each do |id, t|
        row = format(THREAD_ROW, shown(id), t[:samples].to_i, format_percent(t[:samples].to_i))
        row << format(STATE_COLUMNS, *state_shares(t[:states])) if states
        io.puts "#{row}     #{shown(Report.thread_name(t) || '(no name)')}"
      end
    end

    # The running, waiting and blocked shares of a thread's states ("-"
    # without them).
    def state_shares(states)
      return %w[- - -] unless states.is_a?(Hash)

      total = [states.values.sum, 1].max
      ProfileFile::THREAD_STATES.map { |s| format("%5.1f%%", 100.0 * states[s].to_i / total) }
    end

    # The thread a report is restricted to: "ID (NAME)"; for a name several
    # threads share, the name and how many.
    def thread_line
      if (id = @result[:thread])
        name = Report.thread_name(@result.dig(:threads, id))
        return name ? "#{id} (#{name})" : id.to_s
      end

      count = @result[:threads].is_a?(Hash) ? @result[:threads].size : 0
      "#{@selected} (#{count} threads)"
    end

    def modeline
      interval.nil? ? mode : "#{mode}(#{interval})"
    end

    def shown(text)
      Report.printable(text)
    end

    # What ReportSource prints (source lines, and the file's name when it
    # cannot be read), made printable on its way to io; tabs, which source
    # code has, are kept.
    class PrintableLines
      def initialize(io)
        @io = io
      end

      def puts(line)
        @io.puts(Report.printable(line, keep_tabs: true))
      end
    end
    private_constant :PrintableLines
  end
end
