# frozen_string_literal: true

require "json"
require "cgi"

module Strobe
  # Writes a report's stack tree into the self-contained HTML viewer
  # (flamegraph.html: canvas drawing, zoom, search, tooltips, aggregated and
  # timeline views; no network access). The data goes in as one JSON object:
  #
  #   meta      title, mode, interval, samples, view (the one shown first)
  #   frames    parallel arrays name/file/line
  #   tree      parallel arrays parent/frame/self/total, node 0 the root
  #   timeline  the samples in time order as runs of tree nodes (node/count)
  #   markers   the marker lane under the timeline (see #markers), or nil
  #
  # The tree and the runs come from Strobe::Native.report_tree (C), so a
  # flamegraph needs per-sample data (raw: true).
  class Flamegraph
    TEMPLATE = File.expand_path("flamegraph.html", __dir__)
    DATA_PLACEHOLDER = "/*STROBE_DATA*/null"
    TITLE_PLACEHOLDER = "STROBE_TITLE"

    VIEWS = %i[aggregated timeline].freeze

    def initialize(report, title: nil, view: :aggregated)
      raise ArgumentError, "view must be #{VIEWS.map(&:inspect).join(' or ')}, got #{view.inspect}" unless VIEWS.include?(view)

      @report = report
      @title = title || default_title
      @view = view
    end

    def write(io)
      # Every "<" escaped: "</script>" or "<!--" in a frame name would
      # otherwise end or confuse the <script> element. Data first, so a
      # title cannot pull the placeholder into <title>.
      json = JSON.generate(data).gsub("<") { "\\u003c" }
      html = File.read(TEMPLATE).sub(DATA_PLACEHOLDER) { json }
      io.write(html.sub(TITLE_PLACEHOLDER) { CGI.escapeHTML(@title) })
    end

    def data
      tree = @report.stack_tree
      frames = @report.result[:frames]
      details = tree[:frame_ids].map { |id| frames[id] }
      {
        meta: { title: @title, mode: @report.mode, interval: @report.interval, samples: @report.samples,
                unit: "samples", view: @view },
        frames: { name: details.map { |f| f[:name].to_s }, file: details.map { |f| f[:file].to_s },
                  line: details.map { |f| f[:line] }, native: details.map { |f| f[:native] ? 1 : 0 } },
        tree: tree.slice(:parent, :frame, :self, :total),
        timeline: { node: tree[:run_nodes], count: tree[:run_counts] },
        markers: markers,
      }
    end

    # The result's markers for the lane under the timeline, as parallel
    # arrays: type and name; start and end as positions on the timeline
    # (see TimelinePlaces; end nil for an instant); and the lines of each
    # one's tooltip. nil without markers or sample times.
    def markers
      list, stamps, threads = @report.result.values_at(:markers, :raw_sample_timestamps, :raw_sample_threads)
      return nil unless list.is_a?(Array) && !list.empty? && stamps.is_a?(Array) && !stamps.empty?
      raise ProfileError, "markers is malformed" unless list.all? { |m| well_formed?(m) }
      raise ProfileError, "raw_sample_timestamps is malformed" unless stamps.all?(Integer)

      places = TimelinePlaces.new(stamps, threads.is_a?(Array) && threads.size == stamps.size ? threads : nil)
      {
        type: list.map { |m| m[:type].to_s }, name: list.map { |m| m[:name] },
        start: list.map { |m| places.before(m[:thread], m[:start]) },
        end: list.map { |m| m[:end] && places.after(m[:thread], m[:end]) },
        detail: list.map { |m| marker_detail(m) },
      }
    end

    # Where times fall on the timeline, whose positions are the samples in
    # their raw order: per thread, its samples' positions and their times'
    # running maximum (a thread's samples are in time order within one
    # profile; a merge puts each file's after the previous one's, so a
    # marker lands among its own thread's samples, not by the clock alone).
    # A marker of a thread without samples goes by all samples.
    class TimelinePlaces
      def initialize(stamps, threads)
        @all = [stamps.each_index.to_a, running_max(stamps)]
        @threads = {}
        return unless threads

        threads.each_with_index.group_by(&:first).each do |thread, pairs|
          positions = pairs.map(&:last)
          @threads[thread] = [positions, running_max(positions.map { |k| stamps[k] })]
        end
      end

      # The position of thread's first sample at or after time.
      def before(thread, time)
        positions, times = @threads.fetch(thread, @all)
        k = times.bsearch_index { |t| t >= time }
        k ? positions[k] : positions.last + 1
      end

      # The position just after thread's last sample at or before time.
      def after(thread, time)
        positions, times = @threads.fetch(thread, @all)
        k = times.bsearch_index { |t| t > time }
        k ? positions[k] : positions.last + 1
      end

      private

      def running_max(times)
        max = -Float::INFINITY
        times.map { |t| max = t if t > max; max }
      end
    end

    private

    TOOLTIP_LINE = 300

    def well_formed?(marker)
      marker.is_a?(Hash) && marker[:name].is_a?(String) && marker[:start].is_a?(Integer) &&
        (marker[:end].nil? || marker[:end].is_a?(Integer)) && (marker[:data].nil? || marker[:data].is_a?(Hash))
    end

    # Its tooltip: what and where, how long, then its data.
    def marker_detail(marker)
      span = marker[:end] ? format("%.3f ms", (marker[:end] - marker[:start]) / 1000.0) : "an instant"
      lines = ["#{marker[:type]} on #{thread_name(marker[:thread])}, #{span}"]
      (marker[:data] || {}).each do |key, value|
        lines << "#{key}: #{value.is_a?(Array) ? value.join(', ') : value}" unless value.nil?
      end
      lines.map { |line| line.length > TOOLTIP_LINE ? "#{line[0, TOOLTIP_LINE]}…" : line }
    end

    def thread_name(id)
      threads = @report.result[:threads]
      thread = threads.is_a?(Hash) ? threads[id] : nil
      return "no thread" if id.nil?
      return thread[:name] if thread.is_a?(Hash) && thread[:name]

      thread.is_a?(Hash) && thread[:main] ? "main" : "thread #{id}"
    end

    def default_title
      interval = @report.interval ? "(#{@report.interval})" : ""
      "Strobe #{@report.mode}#{interval} profile, #{@report.samples} samples"
    end
  end
end
