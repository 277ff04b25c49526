# frozen_string_literal: true

require_relative "profile_file"

module Strobe
  # Merges results of the same mode and interval (several processes, or
  # several runs) into one result, for `strobe report A.json B.json`.
  #
  # Frame ids are only meaningful within one result (they are addresses in
  # the process that profiled), so frames are matched by name, file and
  # line and renumbered 1, 2, ...; counts, edges and lines are added up,
  # samples are concatenated in the order given (their compact forms, in C:
  # Strobe::Stacks::Builder), threads are merged by id.
  module Merge
    COUNTS = %i[samples gc_samples missed_samples truncated_samples].freeze
    RAW_KEYS = ProfileFile::RAW_KEYS

    module_function

    # list: the results, or anything that yields them in turn (the CLI
    # loads each file as it is reached: a merge then holds the merged
    # profile and one input, not every input). names label the results in
    # error messages (file names, say). A single result is returned as it is.
    def results(list, names = nil)
      merger = Merger.new
      list.each_with_index { |result, i| merger.add(result, names ? names[i] : "profile #{i + 1}") }
      merger.result
    end

    # One merge, result by result: the first is kept aside until a second
    # comes, then both and every later one are folded in.
    class Merger
      def initialize
        @first = nil
        @merged = nil
      end

      def add(result, name)
        raise ProfileError, "#{name}: not a result Hash" unless result.is_a?(Hash)

        if @first.nil? && @merged.nil?
          @first = [result, name]
          return
        end
        start(*@first) if @merged.nil?
        fold(result, name)
      end

      # The merged result (the one result given, as it is; nil for none).
      def result
        return @first&.first unless @merged

        @merged[:threads] = @threads
        @merged.delete(:cwd) unless @same_cwd # relative paths meant different files
        if @stacks
          stacks = @stacks.finish
          stacks ? Stacks.attach(@merged, stacks) : @merged
        end
        @merged[:markers] = @markers unless @markers.empty?
        @merged[:dropped_markers] = @dropped if @dropped.positive?
        @merged
      end

      private

      def start(first, name)
        @first = nil
        @head = first
        @head_name = name
        @merged = first.reject { |key, _| RAW_KEYS.include?(key) || %i[frames threads stacks markers dropped_markers].include?(key) }
        COUNTS.each { |key| @merged[key] = 0 }
        @merged[:metadata] = {}
        @merged.delete(:native)
        @merged.delete(:native_incomplete_samples)
        @merged.delete(:started_at)
        @merged.delete(:duration)
        @merged[:frames] = {}
        @ids = {}
        @threads = {}
        @spans = []
        @same_cwd = true
        @markers = []
        @dropped = 0
        @stacks = Stacks::Builder.new
        fold(first, name)
      end

      def fold(result, name)
        Merge.check_compatible(@head, result, @head_name, name)
        COUNTS.each { |key| @merged[key] += ProfileFile.count(result[key], key.to_s) }
        @merged[:metadata] = @merged[:metadata].merge(result[:metadata]) if result[:metadata].is_a?(Hash)
        @same_cwd &&= result[:cwd] == @head[:cwd]
        fold_native(result)
        map = Merge.merge_frames(result[:frames] || {}, @merged[:frames], @ids)
        Merge.add_edges_and_lines(result[:frames] || {}, @merged[:frames], map)
        Merge.merge_threads(result, map, @threads)
        fold_span(result)
        fold_samples(result, map)
        @markers.concat(result[:markers]) if result[:markers].is_a?(Array)
        @dropped += ProfileFile.count(result[:dropped_markers], "dropped_markers")
      end

      # Native frames in any: the merge has them, and every incomplete stack.
      def fold_native(result)
        return unless result[:native] == true

        @merged[:native] = true
        @merged[:native_incomplete_samples] =
          @merged.fetch(:native_incomplete_samples, 0) +
          ProfileFile.count(result[:native_incomplete_samples] || 0, "native_incomplete_samples")
      end

      # started_at: the earliest start; duration: from there to the latest end.
      def fold_span(result)
        span = [result[:started_at], result[:duration]]
        @spans = nil unless @spans && span.all?(Integer)
        return unless @spans

        @spans << span
        @merged[:started_at] = @spans.map(&:first).min
        @merged[:duration] = @spans.map(&:sum).max - @merged[:started_at]
      end

      # The samples, in the order given, from each result's compact form
      # (made from the raw arrays of a result that has only those); none
      # once a result has no samples to give.
      def fold_samples(result, map)
        return unless @stacks

        stacks = result[:stacks]
        stacks = Stacks.from_raw(result) unless stacks.is_a?(Stacks) || !result[:raw].is_a?(Array)
        return @stacks = nil unless stacks.is_a?(Stacks)

        @stacks.add(stacks, map)
      end
    end

    def check_compatible(first, result, first_name, name)
      %i[mode clock].each do |key|
        next if result[key].to_s == first[key].to_s

        raise ArgumentError, "cannot merge #{name} (#{key} #{result[key]}) with #{first_name} (#{key} #{first[key]})"
      end
      return if result[:interval] == first[:interval]

      raise ArgumentError, "cannot merge #{name} (interval #{result[:interval].inspect}) with #{first_name} " \
                           "(interval #{first[:interval].inspect})"
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

    # Adds a result's threads into threads (merged by id).
    def merge_threads(result, map, threads)
      raise ProfileError, "threads is not a Hash" unless result[:threads].nil? || result[:threads].is_a?(Hash)

      (result[:threads] || {}).each do |id, info|
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
  end
end
