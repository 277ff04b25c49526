# frozen_string_literal: true

require "json"

# A profile file in Strobe's format, written without building a result:
# the frames, a node table of `stacks` distinct stacks `depth` deep
# (each new stack shares a random prefix with an earlier one), and per
# sample a node (mostly another stack than the thread's previous sample),
# a time delta and a thread.
class ScaleData
  FRAMES = 2_000

  def initialize(seed)
    @random = Random.new(seed)
  end

  # Writes path; returns the number of stack nodes.
  def write(path, samples:, threads:, depth:, stacks:, start: 1_000_000_000)
    nodes, leaves = node_table(depth, stacks)
    sample_nodes = Array.new(samples)
    sample_threads = Array.new(samples)
    deltas = Array.new(samples)
    last = Array.new(threads, leaves.first)
    samples.times do |k|
      thread = k % threads
      last[thread] = leaves[@random.rand(leaves.size)] if @random.rand < 0.8
      sample_nodes[k] = last[thread]
      sample_threads[k] = thread
      deltas[k] = thread.zero? ? 1000 - threads + 1 : 1 # each thread sampled every 1000 µs
    end
    doc = {
      strobe_file: 1, version: 1.2, mode: "wall", interval: 1000, samples: samples, gc_samples: 0,
      missed_samples: 0, metadata: {},
      frames: (1..FRAMES).map { |id| { id: id, name: "Module#{id % 97}::Class#{id % 13}#method_#{id}", file: "/app/lib/f#{id % 400}.rb", line: id % 300 + 1, total_samples: 0, samples: 0 } },
      threads: (1..threads).map { |t| { id: 100_000 + t, name: t == 1 ? nil : "worker #{t}", samples: samples / threads, main: t == 1 || nil }.compact },
      stacks: { start_time: start, nodes: nodes, samples: sample_nodes, deltas: deltas, threads: sample_threads },
    }
    counts(doc, samples)
    File.write(path, JSON.generate(doc))
    nodes.size / 3
  end

  private

  # Flat (parent, frame position, line) triples, node ids from 1, and
  # the leaf node of each stack.
  def node_table(depth, stacks)
    nodes = []
    children = {}
    paths = []
    leaves = Array.new(stacks) do
      base = paths.empty? ? [] : paths[@random.rand(paths.size)].first(@random.rand(depth))
      path = base + Array.new(depth - base.size) { @random.rand(FRAMES) }
      paths << path if paths.size < 5_000
      path.each_with_index.reduce(0) do |parent, (frame, level)|
        children[[parent, frame]] ||= begin
          nodes.push(parent, frame, 10 + level)
          nodes.size / 3
        end
      end
    end
    [nodes, leaves]
  end

  # The frames' counts are the loader's to check, not to derive: rough
  # totals keep the text report's rows in order.
  def counts(doc, samples)
    doc[:frames].each_with_index do |frame, i|
      frame[:total_samples] = samples / (i + 2)
      frame[:samples] = samples / (i + 20)
    end
  end
end
