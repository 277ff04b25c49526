# frozen_string_literal: true

# The method report: a method's callers, callees and annotated source
# (Report#print_method), and the walk from it to a caller or callee, and so
# on, read from the terminal (Report#walk_method, `strobe report --method
# NAME --walk`).

module Strobe
  class Report
    # Included into Report: these read the report's frames through its
    # filters (kept_ids), source files and line counts (lines_of).
    module MethodReport
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

      private

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
    end
  end
end
