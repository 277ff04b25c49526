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
      }
    end

    private

    def default_title
      interval = @report.interval ? "(#{@report.interval})" : ""
      "Strobe #{@report.mode}#{interval} profile, #{@report.samples} samples"
    end
  end
end
