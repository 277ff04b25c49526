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
      COUNTS.each { |key| merged[key] = list.sum { |r| r[key].to_i } }
      merged[:metadata] = list.map { |r| r[:metadata] || {} }.reduce({}, :merge)
      ids = {}
      merged[:frames] = {}
      maps = list.map { |r| merge_frames(r[:frames] || {}, merged[:frames], ids) }
      list.zip(maps).each { |r, map| add_edges_and_lines(r[:frames] || {}, merged[:frames], map) }
      merged[:threads] = merge_threads(list)
      merge_raw(list, maps, merged) if list.all? { |r| r[:raw].is_a?(Array) }
      merged
    end

    def check_compatible(list, names)
      first = list.first
      list.each_with_index.drop(1).each do |r, i|
        if r[:mode].to_s != first[:mode].to_s
          raise ArgumentError, "cannot merge #{names[i]} (mode #{r[:mode]}) with #{names[0]} (mode #{first[:mode]})"
        end
        next if r[:interval] == first[:interval]

        raise ArgumentError, "cannot merge #{names[i]} (interval #{r[:interval].inspect}) with #{names[0]} " \
                             "(interval #{first[:interval].inspect})"
      end
    end

    # Adds frames' counts into merged; returns {old id => new id}.
    def merge_frames(frames, merged, ids)
      frames.to_h do |id, frame|
        key = [frame[:name].to_s, frame[:file].to_s, frame[:line]]
        new_id = ids[key] ||= ids.size + 1
        target = merged[new_id] ||= frame.slice(:name, :file, :line).merge(total_samples: 0, samples: 0)
        target[:total_samples] += frame[:total_samples].to_i
        target[:samples] += frame[:samples].to_i
        [id, new_id]
      end
    end

    def add_edges_and_lines(frames, merged, map)
      frames.each do |id, frame|
        target = merged[map[id]]
        (frame[:edges] || {}).each do |callee, count|
          next unless map.key?(callee)

          edges = target[:edges] ||= {}
          edges[map[callee]] = edges.fetch(map[callee], 0) + count.to_i
        end
        (frame[:lines] || {}).each do |line, (total, self_count)|
          pair = (target[:lines] ||= {})[line] ||= [0, 0]
          pair[0] += total.to_i
          pair[1] += self_count.to_i
        end
      end
    end

    def merge_threads(list)
      list.each_with_object({}) do |r, threads|
        (r[:threads] || {}).each do |id, info|
          target = threads[id] ||= { name: info[:name], samples: 0 }
          target[:samples] += info[:samples].to_i
          next unless info[:states]

          states = target[:states] ||= {}
          info[:states].each { |state, n| states[state] = states.fetch(state, 0) + n.to_i }
        end
      end
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
