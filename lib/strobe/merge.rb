# frozen_string_literal: true

require_relative "profile_file"

module Strobe
  # Merges results of the same mode and interval (several processes, or
  # several runs) into one result, for `strobe report A.json B.json`.
  #
  # Frame ids are only meaningful within one result (they are addresses in
  # the process that profiled), so frames are matched by name, file and
  # line and renumbered 1, 2, ...; counts, edges and lines are added up, raw
  # samples are concatenated in the order given, threads are merged by id.
  module Merge
    COUNTS = %i[samples gc_samples missed_samples truncated_samples].freeze
    RAW_KEYS = ProfileFile::RAW_KEYS
    # Per-sample arrays merged by concatenation.
    PER_SAMPLE_KEYS = RAW_KEYS - %i[raw raw_lines]

    module_function

    # names label the results in error messages (file names, say).
    def results(list, names = list.each_index.map { |i| "profile #{i + 1}" })
      return list.first if list.size == 1

      check_compatible(list, names)
      merged = list.first.reject { |key, _| RAW_KEYS.include?(key) || key == :frames || key == :threads }
      COUNTS.each { |key| merged[key] = list.sum { |r| ProfileFile.count(r[key], key.to_s) } }
      merged[:metadata] = list.map { |r| r[:metadata].is_a?(Hash) ? r[:metadata] : {} }.reduce({}, :merge)
      merged.delete(:cwd) unless list.all? { |r| r[:cwd] == list.first[:cwd] } # relative paths meant different files
      merge_native(list, merged)
      ids = {}
      merged[:frames] = {}
      maps = list.map { |r| merge_frames(r[:frames] || {}, merged[:frames], ids) }
      list.zip(maps).each { |r, map| add_edges_and_lines(r[:frames] || {}, merged[:frames], map) }
      merged[:threads] = merge_threads(list, maps)
      merge_span(list, merged)
      merge_raw(list, maps, merged) if list.all? { |r| r[:raw].is_a?(Array) }
      merge_markers(list, merged)
      merged
    end

    # Native frames in any: the merge has them, and every incomplete stack.
    def merge_native(list, merged)
      return unless list.any? { |r| r[:native] == true }

      merged[:native] = true
      merged[:native_incomplete_samples] =
        list.sum { |r| ProfileFile.count(r[:native_incomplete_samples] || 0, "native_incomplete_samples") }
    end

    def check_compatible(list, names)
      first = list.first
      list.each_with_index.drop(1).each do |r, i|
        if r[:mode].to_s != first[:mode].to_s
          raise ArgumentError, "cannot merge #{names[i]} (mode #{r[:mode]}) with #{names[0]} (mode #{first[:mode]})"
        end
        if r[:clock].to_s != first[:clock].to_s
          raise ArgumentError, "cannot merge #{names[i]} (clock #{r[:clock]}) with #{names[0]} (clock #{first[:clock]})"
        end
        next if r[:interval] == first[:interval]

        raise ArgumentError, "cannot merge #{names[i]} (interval #{r[:interval].inspect}) with #{names[0]} " \
                             "(interval #{first[:interval].inspect})"
      end
    end

    # Adds frames' counts into merged; returns {old id => new id}. Two
    # frames of one result with the same name, file and line (Ruby 3.1's two
    # <main> frames of `ruby -e`, with no line) stay two: the second of a
    # result meets the second of another. As one, their totals added up to
    # more than every sample (199% in a merge of two processes).
    def merge_frames(frames, merged, ids)
      raise ProfileError, "frames is not a Hash" unless frames.is_a?(Hash)

      seen = Hash.new(0)
      frames.to_h do |id, frame|
        raise ProfileError, "frame #{id.inspect[0, 40]} is not a Hash" unless frame.is_a?(Hash)

        base = [frame[:name].to_s, frame[:file].to_s, frame[:line]]
        nth = (seen[base] += 1)
        key = nth == 1 ? base : [*base, nth]
        new_id = ids[key] ||= ids.size + 1
        target = merged[new_id] ||= frame.slice(:name, :file, :line, :native).merge(total_samples: 0, samples: 0)
        target[:total_samples] += ProfileFile.count(frame[:total_samples], "total_samples of #{key[0]}")
        target[:samples] += ProfileFile.count(frame[:samples], "samples of #{key[0]}")
        add_trace_numbers(target, frame, key[0]) if frame.key?(:calls)
        [id, new_id]
      end
    end

    # A trace's calls and times, added up.
    def add_trace_numbers(target, numbers, what)
      target[:calls] = target.fetch(:calls, 0) + ProfileFile.count(numbers[:calls], "calls of #{what}")
      %i[total_time self_time].each do |key|
        time = numbers[key]
        raise ProfileError, "#{key} of #{what} is not a number" unless time.is_a?(Numeric)

        target[key] = target.fetch(key, 0.0) + time
      end
    end

    def add_edges_and_lines(frames, merged, map)
      frames.each do |id, frame|
        target = merged[map[id]]
        unless [frame[:edges], frame[:lines]].all? { |v| v.nil? || v.is_a?(Hash) }
          raise ProfileError, "the edges or lines of #{frame[:name]} are not Hashes"
        end

        (frame[:edges] || {}).each do |callee, count|
          next unless map.key?(callee)

          edges = target[:edges] ||= {}
          edges[map[callee]] = edges.fetch(map[callee], 0) + ProfileFile.count(count, "an edge count")
        end
        (frame[:lines] || {}).each do |line, pair|
          raise ProfileError, "the lines of #{frame[:name]} are not {line => [total, self]}" unless pair.is_a?(Array)

          sums = (target[:lines] ||= {})[line] ||= [0, 0]
          sums[0] += ProfileFile.count(pair[0], "a line's total")
          sums[1] += ProfileFile.count(pair[1], "a line's self count")
        end
        raise ProfileError, "the call times of #{frame[:name]} are not a Hash" unless frame[:call_times].nil? || frame[:call_times].is_a?(Hash)

        (frame[:call_times] || {}).each do |callee, time|
          next unless map.key?(callee)
          raise ProfileError, "a call time of #{frame[:name]} is not a number" unless time.is_a?(Numeric)

          times = target[:call_times] ||= {}
          times[map[callee]] = times.fetch(map[callee], 0.0) + time
        end
      end
    end

    def merge_threads(list, maps)
      list.zip(maps).each_with_object({}) do |(r, map), threads|
        raise ProfileError, "threads is not a Hash" unless r[:threads].nil? || r[:threads].is_a?(Hash)

        (r[:threads] || {}).each do |id, info|
          raise ProfileError, "thread #{id.inspect[0, 40]} is not a Hash" unless info.is_a?(Hash)
          raise ProfileError, "the states of thread #{id} are not a Hash" unless info[:states].nil? || info[:states].is_a?(Hash)

          target = threads[id] ||= { name: info[:name], samples: 0 }
          target[:main] = true if info[:main]
          merge_thread_trace(target, info, map) if info.key?(:calls)
          target[:samples] += ProfileFile.count(info[:samples], "a thread's samples")
          next unless info[:states]

          states = target[:states] ||= {}
          info[:states].each { |state, n| states[state] = states.fetch(state, 0) + ProfileFile.count(n, "a thread state's samples") }
        end
      end
    end

    # A trace's thread: its calls, and its frames' numbers under the merged ids.
    def merge_thread_trace(target, info, map)
      target[:calls] = target.fetch(:calls, 0) + ProfileFile.count(info[:calls], "a thread's calls")
      raise ProfileError, "a thread's frames are not a Hash" unless info[:frames].nil? || info[:frames].is_a?(Hash)

      (info[:frames] || {}).each do |id, numbers|
        next unless map.key?(id)
        raise ProfileError, "a thread's frame #{id.inspect[0, 40]} is not a Hash" unless numbers.is_a?(Hash)

        add_trace_numbers((target[:frames] ||= {})[map[id]] ||= {}, numbers, "a thread's frame")
      end
    end

    # started_at: the earliest start; duration: from there to the latest end.
    def merge_span(list, merged)
      spans = list.map { |r| [r[:started_at], r[:duration]] }
      unless spans.all? { |span| span.all?(Integer) }
        merged.delete(:started_at)
        merged.delete(:duration)
        return
      end

      merged[:started_at] = spans.map(&:first).min
      merged[:duration] = spans.map(&:sum).max - merged[:started_at]
    end

    # Markers of every result, in the order given (as raw samples are);
    # dropped ones counted.
    def merge_markers(list, merged)
      merged.delete(:markers)
      merged.delete(:dropped_markers)
      markers = list.flat_map { |r| r[:markers].is_a?(Array) ? r[:markers] : [] }
      merged[:markers] = markers unless markers.empty?
      dropped = list.sum { |r| ProfileFile.count(r[:dropped_markers], "dropped_markers") }
      merged[:dropped_markers] = dropped if dropped.positive?
    end

    def merge_raw(list, maps, merged)
      raw = []
      # Renumbering the frames of every sample is done in C.
      list.zip(maps).each { |r, map| raw.concat(Native.remap_raw(r[:raw], map)) }
      merged[:raw] = raw
      merged[:raw_lines] = list.flat_map { |r| r[:raw_lines] || [] } if list.all? { |r| r[:raw_lines] }
      PER_SAMPLE_KEYS.each do |key|
        merged[key] = list.flat_map { |r| r[key] } if list.all? { |r| r[key].is_a?(Array) }
      end
    end
  end
end
