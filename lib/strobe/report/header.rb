# frozen_string_literal: true

# The header of the sampled text report: mode, thread, samples, GC and
# truncated stacks, and the table of the threads with their GVL states.

module Strobe
  class Report
    # Prints a report's header (Report#print_text):
    #
    #   Header.new(report, selected).print(io)
    #
    # selected is the thread the report was asked for (Report.new's
    # thread:), nil for all of them.
    class Header
      THREAD_HEADER = "    %10s  %10s    (pct)"
      THREAD_ROW = "    %10s  %10d %8s"
      STATE_COLUMNS = "  %7s  %7s  %7s"

      def initialize(report, selected)
        @report = report
        @result = report.result
        @selected = selected
      end

      def print(io)
        io.puts RULE
        io.puts "  Mode: #{shown(modeline)}"
        io.puts "  Thread: #{shown(thread_line)}" if @result[:thread] || @selected
        io.puts format("  Samples: %d (%.2f%% miss rate)", @report.samples, @report.miss_rate)
        io.puts format("  GC: %d (%.2f%%)", @report.gc_samples, @report.gc_rate)
        if @report.truncated_samples.positive?
          io.puts format("  Truncated: %d (%.2f%%), stacks deeper than 1024 frames", @report.truncated_samples,
                         @report.percent(@report.truncated_samples))
        end
        print_threads(io)
        io.puts RULE
      end

      private

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
          row = format(THREAD_ROW, shown(id), t[:samples].to_i, @report.format_percent(t[:samples].to_i))
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
        interval = @report.interval
        interval.nil? ? @report.mode : "#{@report.mode}(#{interval})"
      end

      def shown(text)
        Report.printable(text)
      end
    end
  end
end
