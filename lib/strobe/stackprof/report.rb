# frozen_string_literal: true

require "json"
require "pp"
require "digest/sha2"
require_relative "../report"
require_relative "../merge"

module StackProf
  # stackprof 0.2.27's StackProf::Report, its methods and arguments, with
  # the reports written by Strobe::Report (so in Strobe's layouts where they
  # differ: the text table is stackprof's; the method, Graphviz and callgrind
  # reports are Strobe's; every flamegraph is Strobe's self-contained HTML
  # viewer instead of stackprof's JavaScript for its viewer page or its
  # d3-flame-graph page, which loads d3 from a CDN).
  #
  # Differences kept on purpose: from_file reads a Marshal dump only with
  # marshal: true; print_stackcollapse leaves data[:raw] as it was
  # (stackprof's empties it); frames(...) does not store its sorted copy in
  # data.
  class Report
    MARSHAL_SIGNATURE = "\x04\x08".b
    NO_RAW = "profile does not include raw samples (add `raw: true` to collecting StackProf.run)"

    class << self
      # A report of a profile file: JSON (stackprof's, or Strobe's, possibly
      # gzipped), or a Marshal dump when marshal is true (Marshal data can
      # run code: only for files one trusts). Strobe::ProfileError for
      # anything else.
      def from_file(file, marshal: false)
        content = File.binread(file)
        if content.start_with?(MARSHAL_SIGNATURE)
          unless marshal
            raise Strobe::ProfileError, "#{file}: a Marshal dump; Strobe loads Marshal data only when asked " \
                                        "(StackProf::Report.from_file(path, marshal: true)), since it can run code"
          end
          return new(Marshal.load(content)) # rubocop:disable Security/MarshalLoad -- the caller opted in
        end
        return new(Strobe::ProfileFile.parse(content, file.to_s)) if strobe_file?(content)

        from_json(JSON.parse(content))
      rescue JSON::ParserError, EncodingError
        raise Strobe::ProfileError, "#{file}: not valid JSON (truncated or corrupt)"
      end

      def from_json(json)
        new(parse_json(json))
      end

      # Turns a parsed JSON document's keys back into what stackprof wrote:
      # digit strings into Integers (frame ids, line numbers), others into
      # Symbols, in nested objects too. Changes json in place and returns it.
      def parse_json(json)
        json.keys.each do |key|
          value = json.delete(key)
          parse_json(value) if value.is_a?(Hash)
          json[key.match?(/\A[0-9]*\z/) ? key.to_i : key.to_sym] = value
        end
        json
      end

      private

      def strobe_file?(content)
        Strobe::ProfileFile.magic?(content, Strobe::ProfileFile::GZIP_MAGIC) || content[0, 64].include?('"strobe_file"')
      end
    end

    attr_reader :data

    def initialize(data)
      @data = data
    end

    # The frames, most self (or total) samples first, as a Hash.
    def frames(sort_by_total = false)
      @frames ||= {}
      @frames[sort_by_total ? true : false] ||= begin
        key = sort_by_total ? :total_samples : :samples
        @data[:frames].sort_by { |_, frame| -frame[key] }.to_h
      end
    end

    # The frames keyed by a digest of name, file and line, which is the
    # same for the same method in different profiles.
    def normalized_frames
      digests = @data[:frames].to_h { |id, frame| [id, frame_digest(frame)] }
      @data[:frames].each_with_object({}) do |(id, frame), out|
        copy = frame.merge(hash: digests[id])
        copy[:edges] = frame[:edges].transform_keys { |callee| digests[callee] } if frame[:edges]
        out[digests[id]] = copy
      end
    end

    def version
      @data[:version]
    end

    def modeline
      "#{@data[:mode]}(#{@data[:interval]})"
    end

    def overall_samples
      @data[:samples]
    end

    def max_samples
      @max_samples ||= @data[:frames].values.map { |frame| frame[:samples] }.max
    end

    # {file => {line => [total, self]}} from the frames' lines.
    def files
      @files ||= @data[:frames].each_value.with_object({}) do |frame, out|
        file = frame[:file]
        lines = frame[:lines]
        next unless file && lines

        per_line = out[file] ||= {}
        lines.each { |line, weight| per_line[line] = add_lines(per_line[line], weight) }
      end
    end

    # Adds two line weights: counts, or [total, self] pairs.
    def add_lines(a, b)
      return b if a.nil?
      return a + b if a.is_a?(Integer)
      return [a[0], a[1] + b] if b.is_a?(Integer)

      [a[0] + b[0], a[1] + b[1]]
    end

    def print_debug
      pp @data
    end

    def print_dump(f = $stdout)
      f.puts Marshal.dump(Strobe.expand(@data).reject { |key, _| key == :files })
    end

    def print_json(f = $stdout)
      strobe.print_json(f)
    end

    def print_stackcollapse
      raise NO_RAW unless Strobe::Stacks.samples?(@data)

      strobe.print_stackcollapse($stdout)
    end

    def print_timeline_flamegraph(f = $stdout, skip_common = true)
      print_flamegraph(f, skip_common, false)
    end

    def print_alphabetical_flamegraph(f = $stdout, skip_common = true)
      print_flamegraph(f, skip_common, true)
    end

    # Strobe's HTML flamegraph, opening on its timeline view or, with
    # alphabetical, its aggregated one. skip_common is accepted: the viewer
    # zooms instead.
    def print_flamegraph(f, _skip_common = true, alphabetical = false)
      raise NO_RAW unless Strobe::Stacks.samples?(@data)

      strobe.print_flamegraph(f, view: alphabetical ? :aggregated : :timeline)
    end

    def print_d3_flamegraph(f = $stdout, skip_common = true)
      print_flamegraph(f, skip_common, true)
    end

    # options: :limit (the frames with the most total samples),
    # :node_fraction (leave out frames under it; none by default, as
    # stackprof), :filter (a Regexp: the frames it matches and the callees
    # that get most of their samples from them).
    def print_graphviz(options = {}, f = $stdout)
      only = graph_filter(options[:filter]) if options[:filter]
      strobe.print_graphviz(f, node_fraction: options[:node_fraction] || 0, limit: options[:limit], only: only)
    end

    def print_text(sort_by_total = false, limit = nil, select_files = nil, reject_files = nil, select_names = nil,
                   reject_names = nil, f = $stdout)
      filters = { select_files: select_files, reject_files: reject_files, select_names: select_names,
                  reject_names: reject_names }.compact
      Strobe::Report.new(@data, **filters).print_text(f, limit: limit, sort_by_total: sort_by_total ? true : false)
    end

    def print_callgrind(f = $stdout)
      strobe.print_callgrind(f)
    end

    # name: a Regexp, or a String taken as one (as stackprof does). Prints
    # nothing when no frame matches, as stackprof's.
    def print_method(name, f = $stdout)
      pattern = name.is_a?(Regexp) ? name : Regexp.new(name.to_s)
      return if @data[:frames].each_value.none? { |frame| frame[:name].to_s.match?(pattern) }

      strobe.print_method(f, pattern)
    end

    # Interactive: from name to a caller or callee chosen on standard input,
    # until "exit" or the end of input.
    def walk_method(name)
      strobe.walk_method($stdin, $stdout, Regexp.new(Regexp.escape(name.to_s)))
    end

    def print_files(sort_by_total = false, limit = nil, f = $stdout)
      strobe.print_files(f, limit: limit, sort_by_total: sort_by_total ? true : false)
    end

    # Annotated source of every profiled file whose path contains filter (a
    # String) or matches it (a Regexp).
    def print_file(filter, f = $stdout)
      pattern = filter.is_a?(Regexp) ? filter : Regexp.new(Regexp.escape(filter.to_s))
      paths = @data[:frames].each_value.map { |frame| frame[:file].to_s }.uniq.grep(pattern)
      paths.sort.each { |path| strobe.print_file(f, path) }
    end

    # The two profiles added up (same mode, interval and version), frames
    # matched by name, file and line.
    def +(other)
      raise ArgumentError, "cannot combine #{other.class}" unless self.class == other.class
      raise ArgumentError, "cannot combine #{modeline} with #{other.modeline}" unless modeline == other.modeline
      raise ArgumentError, "cannot combine v#{version} with v#{other.version}" unless version == other.version

      merged = Strobe::Merge.results([@data, other.data])
      self.class.new(Strobe.expand(merged).except(:threads, :raw_sample_threads, :raw_sample_states))
    end

    private

    def strobe
      @strobe ||= Strobe::Report.new(@data)
    end

    def frame_digest(frame)
      Digest::SHA256.hexdigest("#{frame[:name]}#{frame[:file]}#{frame[:line]}")
    end

    # The frames stackprof's Graphviz filter keeps ({id => true}): those
    # whose name matches, then, from each, the callees with at least 1/1.2
    # of their total samples through that edge.
    def graph_filter(filter)
      all = @data[:frames]
      marked = {}
      stack = all.select { |_, frame| frame[:name].to_s.match?(filter) }.keys
      while (id = stack.pop)
        next if marked[id]

        marked[id] = true
        (all[id][:edges] || {}).each do |callee, weight|
          stack << callee if all[callee] && all[callee][:total_samples] <= weight * 1.2
        end
      end
      marked
    end
  end
end
