# frozen_string_literal: true

module Strobe
  # SamplingProf's plain-text format, for tools built on it: four chunks
  # separated by blank lines.
  #
  #   runtime          one line: milliseconds sampled (in time modes the
  #                    samples times the interval, all threads queued up as
  #                    one; otherwise the span of the sample timestamps)
  #   call elements    "file:line:method,id" a line: a line of code in a
  #                    method, as the samples met it
  #   counts           "id,self,total" a line: samples with the element on
  #                    top, and samples with it anywhere (once per sample)
  #   call graph       "caller_id,callee_id,count" a line: samples in which
  #                    the caller element called the callee element (a
  #                    direct recursion is id,id)
  #
  # Needs per-sample data (raw: true): call elements are (frame, line) pairs
  # read off the distinct stacks (from the compact form, or the raw arrays
  # of a result that has only those), each weighted by its samples.
  module SamplingProf
    module_function

    def write(result, io)
      compact = result[:stacks]
      unless compact.is_a?(Stacks) || (result[:raw].is_a?(Array) && result[:raw_lines].is_a?(Array) &&
                                       result[:raw_lines].size == result[:raw].size)
        raise ArgumentError, "the SamplingProf format needs per-sample data: profile with raw: true (strobe run --raw)"
      end

      frames = result[:frames] || {}
      ids = {}
      counts = Hash.new { |h, k| h[k] = [0, 0] }
      calls = Hash.new(0)
      stacks = compact.is_a?(Stacks) ? each_distinct_stack(compact) : to_enum(:each_stack, result[:raw], result[:raw_lines])
      stacks.each do |stack, weight|
        elements = stack.map { |frame, line| ids[[frame, line]] ||= ids.size }
        counts[elements.last][0] += weight
        elements.uniq.each { |e| counts[e][1] += weight }
        elements.each_cons(2).uniq.each { |pair| calls[pair] += weight }
      end
      io.write("#{runtime_ms(result)}\n\n")
      io.write(ids.map { |(frame, line), id| "#{element(frames[frame], line)},#{id}\n" }.join)
      io.write("\n")
      io.write(counts.sort.map { |id, (self_count, total)| "#{id},#{self_count},#{total}\n" }.join)
      io.write("\n")
      io.write(calls.map { |(from, to), n| "#{from},#{to},#{n}\n" }.join)
      io
    end

    # Yields each distinct stack of a compact form that samples end on,
    # root first, as [[frame id, line], ...], with its samples.
    def each_distinct_stack(stacks)
      return to_enum(__method__, stacks) unless block_given?

      parents, frame_ids, lines, samples = stacks.nodes
      samples.each_with_index do |weight, leaf|
        next unless leaf.positive? && weight.positive?

        stack = []
        node = leaf
        while node.positive?
          stack << [frame_ids[node], lines[node]]
          node = parents[node]
        end
        yield stack.reverse!, weight
      end
    end

    # Yields each raw stack, root first, as [[frame id, line], ...], with its
    # repeat count.
    def each_stack(raw, lines)
      i = 0
      while i < raw.size
        depth = raw[i]
        unless depth.is_a?(Integer) && depth >= 0 && i + depth + 1 < raw.size
          raise ProfileError, "raw is truncated at index #{i}"
        end

        yield raw[i + 1, depth].zip(lines[i + 1, depth]), ProfileFile.count(raw[i + depth + 1], "a raw repeat count")
        i += depth + 2
      end
    end

    # "file:line:method": commas and newlines would break the format's
    # lines, so they become spaces.
    def element(frame, line)
      frame ||= {}
      "#{frame[:file]}:#{line}:#{frame[:name]}".tr(",\n\r", "   ")
    end

    def runtime_ms(result)
      interval = result[:interval]
      if interval.is_a?(Integer) && %w[wall cpu].include?(result[:mode].to_s)
        return ProfileFile.count(result[:samples], "samples") * interval / 1000
      end

      compact = result[:stacks]
      first, last = compact.is_a?(Stacks) ? compact.time_span : result[:raw_sample_timestamps]&.values_at(0, -1)
      first.is_a?(Integer) && last.is_a?(Integer) ? (last - first) / 1000 : 0
    end
  end
end
