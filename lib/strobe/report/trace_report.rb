# frozen_string_literal: true

# The reports of a trace (mode :trace): exact calls and times per method
# rather than samples, as a text table, per file, a Graphviz call graph and
# callgrind.

module Strobe
  class Report
    # What Report#print_text, #print_files, #print_graphviz and
    # #print_callgrind print for a trace (Report#print_trace_*), from the
    # report's kept frames.
    class TraceReport
      TRACE_HEADER = "%10s  %12s    (pct)  %12s    (pct)     METHOD\n"

      def initialize(report)
        @report = report
      end

      # A trace's table: calls, total time (the method and its callees,
      # recursion counted once) and self time, in milliseconds, most self
      # time first (or total with sort_by_total).
      def print_text(io, limit:, sort_by_total:)
        rows = @report.frames.map { |id, f| [id, f] }.sort_by do |id, f|
          [-(sort_by_total ? f[:total_time] : f[:self_time]).to_f, f[:name].to_s, id]
        end
        rows = rows.first(limit) if limit
        total = rows.empty? ? 0.0 : wall_time
        io.puts RULE
        io.puts "  Mode: trace(#{shown(@report.result[:clock] || 'wall')})"
        io.puts format("  Calls: %d", @report.samples)
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
      def wall_time
        @report.frames.values.sum { |f| f[:self_time].to_f }
      end

      def time_pct(seconds, total)
        format("(%.1f%%)", total.positive? ? 100.0 * seconds.to_f / total : 0.0)
      end

      # A trace's call graph: each method with its calls, total and self time,
      # each edge with its calls.
      def print_graphviz(io, limit: nil)
        kept = @report.frames.sort_by { |id, f| [-f[:total_time].to_f, id] }
        kept = kept.first(limit) if limit
        ids = kept.to_h { |id, _| [id, true] }
        total = wall_time
        io.puts "digraph profile {"
        io.puts '  node [shape=box, fontsize=10];'
        kept.each do |id, f|
          label = format("%s\\n%d calls\\ntotal %.3f ms %s\\nself %.3f ms %s", @report.dot_escape(f[:name]), f[:calls].to_i,
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

      # A trace per source file: calls and self time of its methods.
      def print_files(io, limit:)
        by_file = @report.frames.values.group_by { |f| @report.source_file(f) }.map do |file, fs|
          [file, fs.sum { |f| f[:calls].to_i }, fs.sum { |f| f[:self_time].to_f }]
        end
        by_file = by_file.sort_by { |file, _, self_time| [-self_time, file] }
        by_file = by_file.first(limit) if limit
        total = wall_time
        io.printf("%10s  %12s    (pct)     FILE\n", "CALLS", "SELF ms")
        by_file.each do |file, calls, self_time|
          io.printf("%10d  %12.3f %8s     %s\n", calls, self_time * 1000, time_pct(self_time, total), shown(file))
        end
      end

      # A trace in the callgrind format: microseconds, each function's own
      # cost and, per call edge, its calls and the time spent in them.
      def print_callgrind(io)
        kept = @report.frames
        micros = ->(seconds) { (seconds.to_f * 1e6).round }
        io.puts "# callgrind format", "version: 1", "creator: strobe", "positions: line", "events: Microseconds"
        io.puts "summary: #{micros.(wall_time)}"
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

      private

      def callgrind_name(name)
        @report.callgrind_name(name)
      end

      def shown(text)
        Report.printable(text)
      end
    end
  end
end
