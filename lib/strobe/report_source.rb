# frozen_string_literal: true

module Strobe
  # Source lines annotated with their samples, for Report#print_file and
  # Report#print_method:
  #
  #         total    (pct) /       self    (pct)  |  line  | source
  #            91  (48.4%) /         91  (48.4%)  |     4  |     x ** 2
  #
  # lines is {line number => [total, self]}. A file that cannot be read
  # (the profile came from another machine) is said so, and the lines with
  # samples are still listed.
  class ReportSource
    def initialize(file, lines, report)
      @file = file
      @lines = lines
      @report = report
    end

    # Prints the lines of range (an endless range runs to the end of the
    # file) that exist in the file.
    def print(io, range, indent: "")
      source = read
      unless source
        io.puts "#{indent}  (source not available: #{@file})"
        @lines.keys.select { |n| range.cover?(n) }.sort.each { |n| print_line(io, indent, n, "") }
        return
      end

      last = [range.end || source.size, source.size].min
      (range.begin..last).each { |n| print_line(io, indent, n, source[n - 1].to_s.chomp) if n >= 1 }
    end

    private

    # Source files larger than this are not shown.
    MAX_BYTES = 16 * 1024 * 1024

    # The file's lines, or nil: only regular text files (a profile may name
    # /dev/zero, a FIFO, or a native frame's shared object) of a sane size
    # are read.
    def read
      return nil unless File.file?(@file) && File.size(@file) <= MAX_BYTES
      return nil if File.binread(@file, 4096)&.include?("\0")

      File.readlines(@file)
    rescue SystemCallError, IOError
      nil
    end

    def print_line(io, indent, number, text)
      total, self_count = @lines[number]
      counts = if total.to_i.zero? && self_count.to_i.zero?
                 " " * 41
               else
                 format("%10d %8s / %10d %8s", total.to_i, @report.format_percent(total.to_i), self_count.to_i,
                        @report.format_percent(self_count.to_i))
               end
      io.puts format("%s%s  | %5d  | %s", indent, counts, number, text)
    end
  end
end
