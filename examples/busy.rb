# frozen_string_literal: true

# A small CPU-bound program with a known split of work, for trying Strobe:
#
#   exe/strobe run --mode cpu -- ruby examples/busy.rb
#
# Busy#run spends roughly half of its time in Busy#crunch_numbers (integer
# math), a third in Busy#build_strings (string building) and the rest in
# Busy#sort_records (sorting), about 1-2 seconds of CPU in all. An optional
# argument scales the amount of work: `ruby examples/busy.rb 0.2` is quicker.
class Busy
  def initialize(scale = 1.0)
    @scale = scale
  end

  def run
    rounds.times do
      crunch_numbers
      build_strings
      sort_records
    end
  end

  # Integer math: a sum of modular squares.
  def crunch_numbers
    total = 0
    i = 0
    while i < 2_500_000
      total = (total + i * i) % 1_000_003
      i += 1
    end
    total
  end

  # String building: appends formatted numbers to one growing String.
  def build_strings
    text = +""
    140_000.times { |i| text << "item-" << i.to_s << ";" }
    text.bytesize
  end

  # Sorting: orders records by a computed key.
  def sort_records
    records = Array.new(9_000) { |i| [(i * 7919) % 20_011, i] }
    records.sort_by { |key, index| [key, -index] }.first
  end

  private

  def rounds
    (20 * @scale).ceil.clamp(1, 10_000)
  end
end

if $PROGRAM_NAME == __FILE__
  scale = ARGV.empty? ? 1.0 : Float(ARGV.first)
  Busy.new(scale).run
end
