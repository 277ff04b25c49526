# frozen_string_literal: true

module Strobe
  # Turns a result Hash (stackprof 0.2.27's shape, as returned by Strobe.run
  # or Strobe.load) into a text report.
  #
  #   Strobe::Report.new(result).print_text($stdout, limit: 20)
  #
  # The data side (#rows, #miss_rate, ...) is kept apart from the printing
  # side (#print_text), so other presentations can reuse it.
  class Report
    # One line of the table: a frame with its total (inclusive) and self
    # sample counts.
    Row = Struct.new(:id, :name, :file, :line, :total, :self_samples, keyword_init: true)

    RULE = "=================================="
    HEADER_FORMAT = "%10s    (pct)  %10s    (pct)     FRAME\n"
    ROW_FORMAT = "%10d %8s  %10d %8s     %s\n"

    # thread: a thread id (a key of result[:threads]) restricts the report to
    # that thread's samples; it needs the per-sample data of raw: true.
    def initialize(result, thread: nil)
      unless result.is_a?(Hash) && (result[:frames].nil? || result[:frames].is_a?(Hash))
        raise ArgumentError, "not a Strobe result: expected a Hash with a :frames Hash, got #{result.class}"
      end

      @result = thread.nil? ? result : self.class.thread_result(result, thread)
    end

    # The result of one thread, derived (in C) from a result with raw data.
    def self.thread_result(result, thread)
      threads = result[:threads].is_a?(Hash) ? result[:threads] : {}
      unless threads.key?(thread)
        known = threads.keys.empty? ? "none" : threads.keys.join(", ")
        raise ArgumentError, "no thread #{thread.inspect} in this profile (threads: #{known})"
      end
      unless result[:raw].is_a?(Array) && result[:raw_sample_threads].is_a?(Array)
        raise ArgumentError, "a report for one thread needs per-sample data: profile with raw: true (strobe run --raw)"
      end

      Native.thread_subset(result, thread)
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
      @result[:samples].to_i
    end

    def gc_samples
      @result[:gc_samples].to_i
    end

    def missed_samples
      @result[:missed_samples].to_i
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

    # The frames as Rows, sorted by self samples (or by total samples with
    # sort_by_total), most first; ties are ordered by name, then location, so
    # the output is the same from run to run. limit keeps the first rows.
    def rows(limit: nil, sort_by_total: false)
      if limit && !(limit.is_a?(Integer) && limit >= 0)
        raise ArgumentError, "limit must be a non-negative Integer, got #{limit.inspect}"
      end

      all = frames.map do |id, frame|
        Row.new(id: id, name: frame[:name].to_s, file: frame[:file].to_s, line: frame[:line],
                total: frame[:total_samples].to_i, self_samples: frame[:samples].to_i)
      end
      sorted = all.sort_by do |row|
        count = sort_by_total ? row.total : row.self_samples
        [-count, row.name, row.file, row.line.to_i, row.id.to_s]
      end
      limit ? sorted.first(limit) : sorted
    end

    # Prints the header and the frame table in stackprof's text layout.
    def print_text(io = $stdout, limit: nil, sort_by_total: false)
      print_header(io)
      if samples.zero?
        io.puts "  No samples were collected."
        return
      end

      io.printf(HEADER_FORMAT, "TOTAL", "SAMPLES")
      rows(limit: limit, sort_by_total: sort_by_total).each do |row|
        io.printf(ROW_FORMAT, row.total, format_percent(row.total), row.self_samples,
                  format_percent(row.self_samples), row.name)
      end
    end

    private

    def frames
      @result[:frames] || {}
    end

    def print_header(io)
      io.puts RULE
      io.puts "  Mode: #{modeline}"
      io.puts "  Thread: #{thread_line}" if @result[:thread]
      io.puts format("  Samples: %d (%.2f%% miss rate)", samples, miss_rate)
      io.puts format("  GC: %d (%.2f%%)", gc_samples, gc_rate)
      print_thread_states(io)
      io.puts RULE
    end

    # With GVL states (Ruby 3.2+), one line per thread: the share of its
    # samples it was running, waiting for the GVL, or blocked.
    def print_thread_states(io)
      threads = @result[:threads].is_a?(Hash) ? @result[:threads].select { |_, t| t[:states].is_a?(Hash) } : {}
      return if threads.empty?

      io.puts "  Threads (running / waiting for the GVL / blocked):"
      threads.sort_by { |id, t| [-t[:samples].to_i, id.to_s] }.each do |id, t|
        states = t[:states]
        total = [states.values.sum, 1].max
        shares = %i[running waiting blocked].map { |s| format("%5.1f%%", 100.0 * states[s].to_i / total) }
        label = t[:name] ? "#{id} (#{t[:name]})" : id.to_s
        io.puts format("    %-28s %8d samples  %s", label, t[:samples].to_i, shares.join(" / "))
      end
    end

    def thread_line
      name = @result.dig(:threads, @result[:thread], :name)
      name ? "#{@result[:thread]} (#{name})" : @result[:thread].to_s
    end

    def modeline
      interval.nil? ? mode : "#{mode}(#{interval})"
    end

    def format_percent(count)
      format("(%2.1f%%)", percent(count))
    end
  end
end
