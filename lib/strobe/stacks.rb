# frozen_string_literal: true

module Strobe
  # A result's samples in compact form (Strobe::Stacks, ext/strobe/stacks.c):
  # result[:stacks] holds the stack nodes once and a node, a time, a thread
  # and a state per sample, 15 bytes a sample.
  #
  # stackprof's raw arrays (raw, raw_lines, raw_sample_timestamps,
  # raw_timestamp_deltas, raw_sample_threads, raw_sample_states) repeat
  # every frame of every stack, hundreds of bytes a sample: a result built
  # by Strobe has them only once they are read. Its default proc, RAW,
  # builds them all from :stacks at the first read of one (`result[:raw]`)
  # and stores them in the result. `result.key?(:raw)` is false until then,
  # and iterating the result does not see them; Strobe.expand(result)
  # builds them at once and gives a plain Hash (for Marshal.dump, or code
  # that walks a result's keys).
  class Stacks
    RAW_KEYS = %i[raw raw_lines raw_sample_timestamps raw_timestamp_deltas raw_sample_threads
                  raw_sample_states].freeze

    # The default proc of a result with :stacks.
    RAW = proc do |result, key|
      next nil unless RAW_KEYS.include?(key)

      stacks = result[:stacks]
      next nil unless stacks.is_a?(Stacks)
      next stacks.raw_arrays[key] if result.frozen? # (built each time: nowhere to keep them)

      # Built before the proc goes: a refusal raises again on the next read.
      arrays = stacks.raw_arrays
      result.default_proc = nil
      result.merge!(arrays) { |_, mine, _| mine }
      result[key]
    end

    # Whether result has its samples (raw: true), and with a column
    # (:times, :threads) too: as a compact form, or as raw arrays. Reading
    # a compact form's result never builds its raw arrays.
    def self.samples?(result, *columns)
      stacks = result[:stacks]
      if stacks.is_a?(Stacks)
        columns.all? { |column| stacks.public_send(:"#{column}?") }
      else
        raw_columns = { times: :raw_sample_timestamps, threads: :raw_sample_threads }
        result[:raw].is_a?(Array) && columns.all? { |column| result[raw_columns.fetch(column)].is_a?(Array) }
      end
    end

    # Gives result its compact form, and the raw arrays built from it as
    # they are read; returns result.
    def self.attach(result, stacks)
      RAW_KEYS.each { |key| result.delete(key) }
      result[:stacks] = stacks
      result.default_proc = RAW
      result
    end

    # The compact form of a result that has only stackprof's raw arrays
    # (stackprof's own, a file in its layout), checked as a file's is.
    def self.from_raw(result)
      frames = (result[:frames] || {}).keys
      threads = result[:threads].is_a?(Hash) ? result[:threads].keys : []
      stamps = result[:raw_sample_timestamps]
      deltas = result[:raw_timestamp_deltas]
      start = stamps.is_a?(Array) && stamps.first.is_a?(Integer) ? stamps.first - (deltas.is_a?(Array) && deltas.first.is_a?(Integer) ? deltas.first : 0) : 0
      nodes, samples, sample_deltas, sample_threads, states =
        Native.compact(result[:raw], result[:raw_lines], stamps, result[:raw_sample_threads], result[:raw_sample_states],
                       frames.each_with_index.to_h, threads.each_with_index.to_h, start)
      holder = {}
      Native.expand(holder, nodes, frames, samples, sample_deltas, start, sample_threads, threads, states, nil)
      holder[:stacks]
    end

    # JSON.generate of a result writes its samples this way: a file's
    # stacks section (profile_file.rb) naming the frame and thread ids
    # themselves, which Strobe.load reads back into a Stacks.
    def to_json(*args)
      frames = frame_ids
      threads = thread_ids
      nodes, samples, deltas, sample_threads, states, start =
        to_file(frames.each_with_index.to_h, threads.each_with_index.to_h)
      { frame_ids: frames, thread_ids: threads, start_time: start, nodes: nodes, samples: samples, deltas: deltas,
        threads: sample_threads, states: states }.to_json(*args)
    end
  end

  class << self
    # result with stackprof's raw arrays built (from its :stacks, if they
    # were not read yet), as a plain Hash: no default proc, no :stacks.
    # Returns a new Hash; result itself keeps its compact form.
    def expand(result)
      result[:raw] if result[:stacks].is_a?(Stacks) # builds them all (Stacks::RAW)
      result.reject { |key, _| key == :stacks }
    end
  end
end
