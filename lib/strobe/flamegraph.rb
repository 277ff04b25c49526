# frozen_string_literal: true

require "json"
require "cgi"
require_relative "markers"

module Strobe
  # Writes a report's stack tree into the self-contained HTML viewer
  # (flamegraph.html: canvas drawing, zoom, search, tooltips, aggregated and
  # timeline views, a thread picker; no network access). The data goes in as
  # one JSON object:
  #
  #   meta      title, mode, interval, samples, view (the one shown first)
  #   frames    parallel arrays name/file/line/native
  #   tree      parallel arrays parent/frame/self/total, node 0 the root:
  #             the aggregated view of every thread
  #   lanes     one per thread with samples (the main thread first, then in
  #             order of their first sample): thread id, name, samples;
  #             runs (node/count/start/end: its samples in time order, on
  #             the axis) for its timeline lane, and self (node/count) for
  #             its own aggregated view
  #   axis      unit ("us", or "samples" without sample times), width, and
  #             the breaks where a long stretch without samples was cut out
  #   markers   each marker's type, name, lane (-1: a thread without
  #             samples), start and end on the axis (end nil for an
  #             instant), tooltip lines; or nil
  #
  # All of it comes from Strobe::Native.flamegraph_data (C), so a
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

    # The page is written in parts: the template around the data, and the
    # data a part at a time (each lane on its own), never joined, since the
    # data is most of the page.
    def write(io)
      payload = data
      # The title goes into the template's part before the data only, so
      # it cannot pull the placeholder into <title>.
      head, tail = File.read(TEMPLATE).split(DATA_PLACEHOLDER, 2)
      io.write(head.sub(TITLE_PLACEHOLDER) { CGI.escapeHTML(@title) })
      write_data(io, payload)
      io.write(tail)
    end

    def data
      native = @report.flamegraph_data
      frames = @report.result[:frames]
      details = native[:frame_ids].map { |id| frames[id] }
      lanes = lanes(native[:lanes])
      axis = Axis.new(native[:axis])
      {
        meta: { title: @title, mode: @report.mode, interval: @report.interval, samples: @report.samples,
                unit: "samples", view: @view },
        frames: { name: details.map { |f| text(f[:name]) }, file: details.map { |f| text(f[:file]) },
                  line: details.map { |f| f[:line] }, native: details.map { |f| f[:native] ? 1 : 0 } },
        tree: native.slice(:parent, :frame, :self, :total),
        lanes: lanes,
        axis: { unit: native[:axis][:unit].to_s, width: native[:axis][:width], breaks: axis.breaks },
        markers: markers(axis, lanes),
      }
    end

    # The lanes of the threads with samples: the main thread first, then
    # by their first sample.
    def lanes(native)
      list = native[:thread].each_index.filter_map do |t|
        next if native[:samples][t].zero?

        id = native[:thread][t]
        nodes, counts = native[:self][t]
        { thread: id, name: id.nil? ? "all threads" : text(thread_name(id)), main: main_thread?(id),
          samples: native[:samples][t], runs: native[:runs][t], self: { node: nodes, count: counts } }
      end
      list.sort_by.with_index { |lane, i| [lane[:main] ? 0 : 1, lane[:runs][:start].first || 0, i] }
          .map { |lane| lane.except(:main) }
    end

    # The samples' clock mapped onto the axis (see flamegraph.c): segments
    # of time placed one after the other, with a break between two.
    class Axis
      def initialize(native)
        @from, @to, @at = native.values_at(:seg_from, :seg_to, :seg_at)
        @timed = native[:unit] == :us
      end

      def timed? = @timed

      # Where a break is drawn: the middle of each cut stretch.
      def breaks
        (1...@at.size).map { |i| (@at[i - 1] + (@to[i - 1] - @from[i - 1]) + @at[i]) / 2 }
      end

      # Where time falls: in the last segment that starts at or before it,
      # never past the next one's start.
      def at(time)
        i = @from.bsearch_index { |from| from > time }
        i = (i || @from.size) - 1
        return 0 if i.negative?

        place = @at[i] + (time - @from[i])
        i + 1 < @at.size && place > @at[i + 1] ? @at[i + 1] : place
      end
    end

    # The result's markers, each placed on the axis by its times, in the
    # lane of its thread. nil without markers or sample times.
    def markers(axis, lanes)
      list = @report.result[:markers]
      return nil unless list.is_a?(Array) && !list.empty? && axis.timed?
      raise ProfileError, "markers is malformed" unless list.all? { |m| well_formed?(m) }

      lane_of = lanes.each_with_index.to_h { |lane, i| [lane[:thread], i] }
      {
        type: list.map { |m| text(m[:type]) }, name: list.map { |m| text(m[:name]) },
        lane: list.map { |m| lane_of.fetch(m[:thread], -1) },
        start: list.map { |m| axis.at(m[:start]) },
        end: list.map { |m| m[:end] && axis.at([m[:end], m[:start]].max) },
        detail: list.map { |m| marker_detail(m) },
      }
    end

    private

    TOOLTIP_LINE = 300

    # payload as one JSON object, a part at a time.
    def write_data(io, payload)
      io.write("{")
      payload.each_with_index do |(key, value), i|
        io.write(i.zero? ? "#{JSON.generate(key.to_s)}:" : ",#{JSON.generate(key.to_s)}:")
        if key == :lanes
          io.write("[")
          value.each_with_index { |lane, j| io.write(j.zero? ? script_json(lane) : ",#{script_json(lane)}") }
          io.write("]")
        else
          io.write(script_json(value))
        end
      end
      io.write("}")
    end

    # value as JSON that cannot end or confuse the <script> element it goes
    # in: every "<" escaped ("</script>" or "<!--" in a frame name).
    def script_json(value)
      json = JSON.generate(value)
      json.gsub!("<") { "\\u003c" }
      json
    end

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
      lines.map { |line| text(line) }.map { |line| line.length > TOOLTIP_LINE ? "#{line[0, TOOLTIP_LINE]}…" : line }
    end

    # A name or line as valid UTF-8: JSON holds nothing else, and a profile
    # file from elsewhere may have any bytes in its names.
    def text(value)
      Markers.utf8(value.to_s)
    end

    def main_thread?(id)
      threads = @report.result[:threads]
      thread = threads.is_a?(Hash) ? threads[id] : nil
      id.nil? || (thread.is_a?(Hash) && thread[:main] == true)
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
